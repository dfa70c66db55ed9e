"""Writes on the registry: models, versions (registered from a finished recipe job,
then exported by a task), aliases, and the poll that registers ``register_as`` jobs."""

from __future__ import annotations

import logging
import re
import shutil
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError
from django.utils import timezone

from identity.selectors import identity_isolated
from identity.services import IdentityMissing
from jobs.choices import JobState
from jobs.models import Job, JobEvent
from jobs.services import job_account, job_root
from mtc import userfs
from mtc.queue import task_enqueue
from mtc.secretfile import private_dir

from .checkpoints import final_checkpoint
from .export import OUT_NAME, ExportFailed, export_limits, export_run, mtc_account, staging_dir
from .intake import Taken, take_back
from .models import Model, ModelAlias, ModelVersion, VersionState
from .names import ALIAS_RE, NAME_HELP, model_name_valid, model_ref_parse
from .selectors import model_can_write, register_as_problem

log = logging.getLogger(__name__)
# How long a completed job's last metrics may stay unread before it is registered anyway.
METRICS_GRACE = timedelta(minutes=2)
DATA_HELP = {
    "llama-pretrain": "the Python standard library's sources",
    "gemma-pretrain": "the Python standard library's sources",
    "continued-pretrain": "the Python standard library's sources",
    "sft": "generated arithmetic Q&A",
    "rl": "generated arithmetic tasks (reward: the exact answer)",
}


class RegistryError(Exception):
    """A request the registry refuses (HTTP 400); ``fields`` by JSON path."""

    def __init__(self, message: str, fields: dict[str, str] | None = None):
        self.fields = fields or {}
        super().__init__(message)


class RegistryConflict(Exception):
    """The registry's state does not allow this (HTTP 409)."""

    def __init__(self, message: str, code: str = "FAILED_PRECONDITION"):
        self.code = code
        super().__init__(message)


# --- models --------------------------------------------------------------------------
def _check_write(user, model: Model) -> None:
    if not model_can_write(user, model):
        raise PermissionDenied(f"Model '{model.name}' belongs to another user.")


def model_create(*, name: str, description: str = "", owner) -> Model:
    if not isinstance(name, str) or not model_name_valid(name):
        raise RegistryError(f"Invalid model name: {NAME_HELP}", {"name": NAME_HELP})
    try:
        with transaction.atomic():
            return Model.objects.create(name=name, description=description, owner=owner)
    except IntegrityError as exc:
        raise RegistryConflict(
            f"A model named '{name}' already exists.", code="ALREADY_EXISTS"
        ) from exc


def _model_for_registration(*, name: str, owner) -> Model:
    """The named model, created (owned by ``owner``) when it does not exist yet."""
    model = Model.objects.filter(name=name).first()
    if model is not None:
        return model
    try:
        return model_create(name=name, owner=owner)
    except RegistryConflict:  # created by a concurrent registration
        return Model.objects.get(name=name)


# --- versions --------------------------------------------------------------------------
def _next_number(model: Model) -> int:
    """Take the model's next version number (compare-and-swap: concurrent registrations
    each get their own, and a deleted number is never handed out again)."""
    while True:
        current = Model.objects.filter(pk=model.pk).values_list("last_version_number", flat=True)
        last = current.get()
        taken = Model.objects.filter(pk=model.pk, last_version_number=last).update(
            last_version_number=last + 1, update_time=timezone.now()
        )
        if taken:
            return last + 1


def _parent_of(job: Job) -> ModelVersion | None:
    """The version the job started from (recorded at launch as init_from_version)."""
    ref = (job.parameters or {}).get("init_from_version")
    parsed = model_ref_parse(f"models/{ref}") if isinstance(ref, str) else None
    if parsed is None or not isinstance(parsed[1], int):
        return None
    name, number = parsed
    return ModelVersion.objects.filter(model__name=name, number=number).first()


def _training_data(job: Job) -> dict:
    params = job.parameters or {}
    data = {
        "data_path": params.get("data_path"),
        "description": params.get("data_path") or DATA_HELP.get(job.recipe, ""),
    }
    for key in ("steps", "global_batch", "seq_len", "max_operand", "seed"):
        if key in params:
            data[key] = params[key]
    if isinstance(params.get("steps"), int) and isinstance(params.get("global_batch"), int):
        data["sequences_seen"] = params["steps"] * params["global_batch"]
    return data


def _final_metrics(job: Job) -> dict:
    return {k: v for k, v in (job.metrics or {}).items() if k != "done"}


def version_register(*, job: Job, model_name: str, created_by) -> ModelVersion:
    """Register ``job``'s final checkpoint as the model's next version (PENDING; the
    export task makes it READY). Raises RegistryError, RegistryConflict or
    PermissionDenied. A job has at most one version (unique source_job)."""
    if job.state != JobState.COMPLETED:
        raise RegistryConflict(f"Job {job.job_id} is {job.state}; only a COMPLETED job registers.")
    if not job.recipe or not job.checkpoint_dir:
        raise RegistryError(
            f"Job {job.job_id} is not a recipe job: it has no checkpoints to register.",
            {"job_id": "Not a recipe job."},
        )
    checkpoint = final_checkpoint(job.checkpoint_dir)
    if checkpoint is None:
        raise RegistryError(
            f"Job {job.job_id} left no complete checkpoint in {job.checkpoint_dir}.",
            {"job_id": "No complete checkpoint."},
        )
    model = Model.objects.filter(name=model_name).first()
    if model is not None:
        _check_write(created_by, model)
    return _version_create(job=job, model_name=model_name, checkpoint=checkpoint, by=created_by)


def _version_create(
    *, job: Job, model_name: str, checkpoint: Path | None, by, failure: str = ""
) -> ModelVersion:
    model = _model_for_registration(name=model_name, owner=by)
    if by is not None:  # checked again here: the model may be someone else's by now
        _check_write(by, model)
    try:
        with transaction.atomic():
            version = ModelVersion.objects.create(
                model=model,
                number=_next_number(model),
                state=VersionState.FAILED if failure else VersionState.PENDING,
                status_message=failure[:500],
                source_job=job,
                cluster=job.cluster,
                recipe=job.recipe,
                parameters=job.parameters or {},
                data=_training_data(job),
                metrics=_final_metrics(job),
                parent=_parent_of(job),
                checkpoint_path=str(checkpoint or ""),
                created_by=by,
            )
            if not failure:
                _enqueue_export(version)
    except IntegrityError as exc:  # unique source_job: registered by someone else
        raise RegistryConflict(
            f"Job {job.job_id} is already registered as "
            f"{ModelVersion.objects.filter(source_job=job).first()}.",
            code="ALREADY_EXISTS",
        ) from exc
    return version


def _enqueue_export(version: ModelVersion) -> None:

    task_enqueue("registry.tasks.version_export_run", version.pk)


def export_dir(version: ModelVersion) -> Path:
    return Path(settings.DATA_DIR) / "registry" / version.model.name / str(version.number)


def _export_account(version: ModelVersion):
    """Who the export runs as: the job owner's account when jobs are isolated (the
    checkpoint is theirs to write, so only they unpickle it); mtc itself, still in a
    limited subprocess, in single-user mode and for mtc's own jobs (whose checkpoints
    only mtc writes). Raises IdentityMissing."""
    job = version.source_job
    owner = job.owner if job is not None else version.created_by
    if owner is None or not identity_isolated():
        return None
    return job_account(owner)


def _staging_parent(version: ModelVersion, account) -> Path:
    """A directory of the export's account to stage it in: the owner's job root."""
    if account is None:
        return private_dir(Path(settings.DATA_DIR) / "registry" / ".staging")
    job = version.source_job
    cluster = version.cluster or (job.cluster if job is not None else None)
    if cluster is None:
        raise ExportFailed("its cluster is gone, and the owner's folders on it")
    return job_root(cluster, account)


def _export(version: ModelVersion, out: Path) -> Taken:
    account = _export_account(version)
    runner = account or mtc_account()
    info = {"model": version.model.name, "version": version.number, "recipe": version.recipe}
    parent = _staging_parent(version, account)
    with staging_dir(parent, runner, prefix=f".mtc-export-{version.pk}-") as staging:
        export_run(
            account=runner,
            checkpoint=Path(version.checkpoint_path),
            staging=staging,
            info=info,
        )
        return take_back(
            staging_fd=staging.fd,
            name=OUT_NAME,
            uid=runner.uid,
            out_dir=out,
            max_bytes=export_limits()[0],
            info={**info, "checkpoint": version.checkpoint_path},
        )


def version_export(*, version: ModelVersion) -> None:
    """PENDING → READY (export written) or FAILED (with the reason). Safe to run twice:
    only a PENDING version is exported, and only its first finish is recorded."""
    if version.state != VersionState.PENDING:
        return
    out = export_dir(version)
    for stale in out.parent.glob(f".{out.name}.partial-*"):  # a worker that died mid-way
        shutil.rmtree(stale, ignore_errors=True)
    try:
        taken = _export(version, out)
    except (ExportFailed, IdentityMissing) as exc:
        _export_finish(version, VersionState.FAILED, f"Export failed: {exc}")
        return
    except Exception as exc:  # noqa: BLE001 - any failure is the version's, shown to its owner
        log.exception("export of %s failed", version)
        _export_finish(version, VersionState.FAILED, f"Export failed: {type(exc).__name__}: {exc}")
        return
    if not _export_finish(version, VersionState.READY, taken.message(), str(out)):
        # Deleted (or finished by another run) while exporting: keep only a READY one's.
        if not ModelVersion.objects.filter(
            pk=version.pk, state=VersionState.READY, export_path=str(out)
        ).exists():
            shutil.rmtree(out, ignore_errors=True)


def _export_finish(version: ModelVersion, state: str, message: str, export_path: str = "") -> bool:
    done = ModelVersion.objects.filter(pk=version.pk, state=VersionState.PENDING).update(
        state=state, status_message=message[:500], export_path=export_path
    )
    return bool(done)


def version_delete(*, version: ModelVersion, actor) -> None:
    """Delete a version and its export; refused (RegistryConflict) while an endpoint
    serves it."""
    _check_write(actor, version.model)
    # serving.Endpoint.version protects it (on_delete=PROTECT); ask first for the names.
    if hasattr(version, "endpoints") and version.endpoints.exists():
        names = ", ".join(_endpoint_name(e) for e in version.endpoints.all()[:5])
        raise RegistryConflict(_in_use(version, names))
    try:
        with transaction.atomic():
            if version.source_job_id:  # so the poll does not register the job again
                Job.objects.filter(pk=version.source_job_id).update(register_as="")
            version.delete()
    except ProtectedError as exc:
        names = ", ".join(_endpoint_name(e) for e in list(exc.protected_objects)[:5])
        raise RegistryConflict(_in_use(version, names)) from exc
    out = export_dir(version)
    transaction.on_commit(lambda: shutil.rmtree(out, ignore_errors=True))


def _endpoint_name(endpoint) -> str:
    return str(getattr(endpoint, "name", "") or endpoint)


def _in_use(version: ModelVersion, names: str) -> str:
    return (
        f"Version {version.number} of '{version.model.name}' is served by endpoint {names}; "
        "delete the endpoint or point it at another version first."
    )


# --- aliases ---------------------------------------------------------------------------
def alias_set(*, model: Model, alias: str, number: int | None, actor) -> ModelAlias | None:
    """Point ``alias`` at version ``number`` (moving it if it pointed elsewhere), or
    remove it when ``number`` is None."""
    _check_write(actor, model)
    if not isinstance(alias, str) or not re.fullmatch(ALIAS_RE, alias):
        raise RegistryError(
            "Invalid alias.", {"alias": "Lower-case letter first, then a-z 0-9 _ -; 32 at most."}
        )
    if number is None:
        ModelAlias.objects.filter(model=model, alias=alias).delete()
        return None
    version = ModelVersion.objects.filter(model=model, number=number).first()
    if version is None:
        raise RegistryError(
            f"Model '{model.name}' has no version {number}.", {"version": "No such version."}
        )
    if version.state == VersionState.FAILED:
        raise RegistryError(
            f"Version {number} failed to export; an alias must name a usable version.",
            {"version": "This version is FAILED."},
        )
    with transaction.atomic():
        entry, _ = ModelAlias.objects.update_or_create(
            model=model, alias=alias, defaults={"version": version}
        )
    return entry


# --- the poll --------------------------------------------------------------------------
def _metrics_settled(job: Job, now) -> bool:
    """Whether the poller has stored the run's last metrics (the version's figures)."""
    path = job.metrics_path
    try:
        unread = path is not None and userfs.lookup(path).st_size > job.metrics_offset
    except OSError:
        unread = False
    return not unread or (job.end_time is not None and now - job.end_time > METRICS_GRACE)


def registrations_process() -> int:
    """Register every COMPLETED job that asked to be (``register_as``) and has no version
    yet. Safe to run twice at once: a job's version is unique, numbers are taken by
    compare-and-swap. A job without a usable checkpoint becomes a FAILED version that
    says why, so the request is answered, not retried forever."""
    now = timezone.now()
    registered = 0
    pending = (
        Job.objects.filter(state=JobState.COMPLETED, model_version__isnull=True)
        .exclude(register_as="")
        .select_related("cluster", "owner")
        .order_by("end_time", "pk")  # numbered in the order they finished
    )
    for job in pending:
        if not _metrics_settled(job, now):
            continue
        checkpoint = final_checkpoint(job.checkpoint_dir) if job.checkpoint_dir else None
        failure = "" if checkpoint else f"No complete checkpoint in {job.checkpoint_dir or '-'}."
        try:
            # The owner's right to the model is checked now, not only at launch: someone
            # else may have created it while the job ran.
            problem = register_as_problem(job.register_as, job.owner)
            if problem:
                _registration_refused(job, problem)
                continue
            _version_create(
                job=job,
                model_name=job.register_as,
                checkpoint=checkpoint,
                by=job.owner,
                failure=failure,
            )
        except RegistryConflict:
            continue  # another worker registered it first
        except (PermissionDenied, RegistryError) as exc:
            _registration_refused(job, str(exc))
            continue
        except Exception:  # noqa: BLE001 - one bad job must not stop the others
            log.exception("registering job %s as %s failed", job, job.register_as)
            continue
        registered += 1
    return registered


def _registration_refused(job: Job, reason: str) -> None:
    """Answer a ``register_as`` the job may not have: a line in the job's history (its
    page and the API show it), and no more tries (``register_as`` cleared, as for a job
    whose version was deleted)."""
    with transaction.atomic():
        cleared = Job.objects.filter(pk=job.pk, register_as=job.register_as).update(register_as="")
        if cleared:  # once, even when two polls refuse it at the same moment
            JobEvent.objects.create(
                job=job,
                time=timezone.now(),
                state=job.state,
                cause=f"Not registered as '{job.register_as}': {reason}"[:300],
            )
    log.info("job %s not registered as %s: %s", job, job.register_as, reason)
