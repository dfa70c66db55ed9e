"""The export runs as the job's owner (MTC_IDENTITY=local): a checkpoint whose DCP
metadata is a hostile pickle runs its code as the owner, never as mtc; mtc takes back
only files it can check without unpickling. And ``register_as`` is checked again when
the job registers, not only at launch."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from clusters.models import Cluster
from clusters.spec import validate_cluster_spec
from identity.runas import run_as
from identity.services import account_ensure
from identity.sources import local
from jobs.models import JobEvent
from jobs.services import job_root
from registry import intake, services
from registry.export import ExportFailed
from registry.models import Model, ModelVersion

from .conftest import make_spec
from .test_registry import TINY_RUN, completed_job, register
from .unix import give

STEP = "step-000003"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished tiny llama-pretrain run (3 steps), as in tests/test_registry.py."""
    from node.train import train

    run = tmp_path_factory.mktemp("owner") / "run-1"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({**TINY_RUN, "run_dir": str(run)}))
    assert train.main(["--config", str(run / "run.json")]) == 0
    return run


@pytest.fixture
def cluster(db):
    """A cluster row whose folders live in the session's data dir (0711 above them, so
    an owner's account reaches its own job root)."""
    spec = validate_cluster_spec(make_spec("rx", nodes=1))
    cluster = Cluster.objects.create(cluster_id="rx", spec=spec, state="RUNNING")
    yield cluster
    shutil.rmtree(Path(django_settings.DATA_DIR) / "clusters" / "rx", ignore_errors=True)
    shutil.rmtree(Path(django_settings.DATA_DIR) / "registry", ignore_errors=True)


@pytest.fixture
def account(settings, user):
    """uma (not staff) with her own Unix account; removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("local identity needs root")
    settings.MTC_IDENTITY = "local"
    settings.CELERY_TASK_ALWAYS_EAGER = True
    made = account_ensure(user=user)
    assert made.uid != 0 and made.source == "local"
    yield made
    local.account_delete(made.name)


def owners_run(cluster, account, finished_run: Path) -> Path:
    """The finished run copied into the owner's job root, theirs as a job leaves it."""
    runs = job_root(cluster, account) / "runs"
    shutil.copytree(finished_run, runs / "r1")
    give(runs, account)
    return runs / "r1"


class WritesMarker:
    """Unpickled, it opens (creates) ``path``: whoever unpickles it owns the file."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def poison(step_dir: Path, payload: object) -> None:
    """Replace the DCP metadata, and the COMPLETE marker's size for it (both are the
    owner's to write), so the checkpoint still looks complete."""
    metadata = step_dir / ".metadata"
    metadata.write_bytes(pickle.dumps(payload))
    marker = json.loads((step_dir / "COMPLETE").read_text())
    marker["files"][".metadata"] = metadata.stat().st_size
    (step_dir / "COMPLETE").write_text(json.dumps(marker))


def test_a_hostile_checkpoint_metadata_runs_as_its_owner_never_as_mtc(
    cluster,
    account,
    user,
    finished_run,
    django_capture_on_commit_callbacks,
):
    run = owners_run(cluster, account, finished_run)
    marker = job_root(cluster, account) / "unpickled-by"
    poison(run / "checkpoints" / STEP, WritesMarker(marker))
    give(run, account)
    job = completed_job(cluster, user, run, register_as="poisoned")

    version = register(job, django_capture_on_commit_callbacks)  # the worker does not crash

    assert version.state == "FAILED" and version.status_message.startswith("Export failed: ")
    # The payload ran (DCP unpickles the metadata) in the owner's process, not in mtc's.
    assert marker.exists(), version.status_message
    assert os.stat(marker).st_uid == account.uid != 0
    assert not (Path(django_settings.DATA_DIR) / "registry" / "poisoned" / "1").exists()
    assert not list(job_root(cluster, account).glob(".mtc-export-*"))  # staging removed


def test_the_owners_export_is_ready_and_only_checkable_files_come_back(
    cluster,
    account,
    user,
    finished_run,
    monkeypatch,
    django_capture_on_commit_callbacks,
):
    run = owners_run(cluster, account, finished_run)
    real_run = services.export_run

    def export_then_leave_extras(*, account, checkpoint, staging, info):
        real_run(account=account, checkpoint=checkpoint, staging=staging, info=info)
        # What the owner's process may leave beside the export (it runs their code).
        script = (
            "import os, pickle, sys; out = sys.argv[1]\n"
            "open(os.path.join(out, 'pytorch_model.bin'), 'wb').write(pickle.dumps({'w': 1}))\n"
            "open(os.path.join(out, 'optimizer.pt'), 'wb').write(b'x')\n"
            "os.symlink('/etc/shadow', os.path.join(out, 'shadow.txt'))\n"
            "os.mkdir(os.path.join(out, 'extra'))\n"
        )
        done = run_as(account, [sys.executable, "-c", script, str(staging.out)], timeout=60)
        assert done.returncode == 0

    monkeypatch.setattr(services, "export_run", export_then_leave_extras)
    job = completed_job(cluster, user, run, register_as="owned")
    version = register(job, django_capture_on_commit_callbacks)

    assert version.state == "READY", version.status_message
    export = Path(version.export_path)
    names = sorted(p.name for p in export.iterdir())
    assert "model.safetensors" in names and "tokenizer.json" in names
    assert "config.json" in names and "mtc_export.json" in names
    for left in ("pytorch_model.bin", "optimizer.pt", "shadow.txt", "extra"):
        assert left not in names
        assert left in version.status_message
    assert all(os.lstat(export / n).st_uid == os.geteuid() for n in names)  # mtc's copy
    info = json.loads((export / "mtc_export.json").read_text())
    assert info["model"] == "owned" and info["version"] == 1 and info["step"] == 3
    assert info["left_out"] == ["extra", "optimizer.pt", "pytorch_model.bin", "shadow.txt"]
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(export).config.model_type == "llama"


# --- what intake refuses (no subprocess) ------------------------------------------------------
def _staged(tmp_path: Path, finished_run: Path) -> Path:
    """A directory as a clean export leaves it (the run's files standing in for it)."""
    out = tmp_path / "staging" / "model"
    out.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    (out / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    (out / "config.json").write_text("{}")
    shutil.copyfile(finished_run / "checkpoints" / STEP / "tokenizer.json", out / "tokenizer.json")
    return out


def _take(tmp_path: Path):
    fd = os.open(tmp_path / "staging", os.O_RDONLY | os.O_DIRECTORY)
    try:
        return intake.take_back(
            staging_fd=fd,
            name="model",
            uid=os.geteuid(),
            out_dir=tmp_path / "registry" / "m" / "1",
            max_bytes=2**30,
            info={"model": "m", "version": 1},
        )
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "spoil, message",
    [
        (lambda d: (d / "model.safetensors").write_bytes(b"\x80\x04K\x01."), "header length"),
        (
            lambda d: (d / "model.safetensors").write_bytes(b"\x05" + b"\0" * 7 + b"nope!"),
            "not JSON",
        ),
        (lambda d: (d / "config.json").write_text("[1]"), "not a JSON object"),
        (
            lambda d: ((d / "config.json").unlink(), (d / "config.json").symlink_to("/etc/hosts")),
            "cannot be opened",
        ),
        (lambda d: os.chown(d / "tokenizer.json", 54321, 54321), "belongs to uid 54321"),
        (lambda d: (d / "config.json").unlink(), "wrote no config.json"),
    ],
)
def test_intake_refuses_what_it_cannot_check(tmp_path, finished_run, spoil, message):
    if os.geteuid() != 0 and "uid" in message:
        pytest.skip("chown needs root")
    spoil(_staged(tmp_path, finished_run))
    with pytest.raises(ExportFailed, match=message):
        _take(tmp_path)
    assert not (tmp_path / "registry" / "m" / "1").exists()
    assert not list((tmp_path / "registry" / "m").glob(".1.partial-*"))


def test_intake_copies_a_clean_export(tmp_path, finished_run):
    _staged(tmp_path, finished_run)
    taken = _take(tmp_path)
    assert taken.files == ["config.json", "model.safetensors", "tokenizer.json", "mtc_export.json"]
    assert taken.left_out == [] and taken.bytes > 0


def test_the_status_line_drops_the_nul_characters_an_export_wrote():
    # The owner's process writes mtc_export.json; the line is stored (PostgreSQL: no NUL).
    info = {"architecture": "Llama\x00ForCausalLM", "dtype": "bf\x0016", "parameters": 10}
    info["step"] = 3
    taken = intake.Taken(bytes=2_000_000, info=info)
    assert taken.message() == "Exported LlamaForCausalLM (10 parameters, bf16, 2.0 MB) from step 3."


# --- register_as at registration time ---------------------------------------------------------
def test_register_as_is_checked_when_the_job_registers(
    cluster,
    user,
    user_api,
    django_user_model,
    finished_run,
    settings,
):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    job = completed_job(cluster, user, finished_run, register_as="taken")
    # Launched when "taken" was free; another user created it while the job ran.
    otto = django_user_model.objects.create_user("otto", password="pw-otto-1")
    Model.objects.create(name="taken", owner=otto)

    assert services.registrations_process() == 0
    assert not ModelVersion.objects.exists()
    job.refresh_from_db()
    assert job.register_as == ""  # answered: not retried on every poll
    event = JobEvent.objects.get(job=job)
    assert event.cause == "Not registered as 'taken': Model 'taken' belongs to another user."
    history = user_api.get(f"/api/v1/clusters/rx/jobs/{job.job_id}").json()["history"]
    assert any("Not registered as 'taken'" in e["cause"] for e in history)
    assert services.registrations_process() == 0 and JobEvent.objects.filter(job=job).count() == 1


def test_a_model_taken_between_the_check_and_the_version_is_refused_too(
    cluster,
    user,
    django_user_model,
    finished_run,
    settings,
    monkeypatch,
):
    """The model appears after register_as_problem looked (a concurrent create)."""
    job = completed_job(cluster, user, finished_run, register_as="raced")
    otto = django_user_model.objects.create_user("otto", password="pw-otto-1")
    Model.objects.create(name="raced", owner=otto)
    monkeypatch.setattr(services, "register_as_problem", lambda name, user: None)

    assert services.registrations_process() == 0
    assert not ModelVersion.objects.exists()
    event = JobEvent.objects.get(job=job)
    assert "belongs to another user" in event.cause


# --- limits (single-user: the export runs as mtc, still a limited subprocess) -------------------
def test_an_export_past_its_memory_limit_fails_and_says_so(
    cluster, user, finished_run, settings, django_capture_on_commit_callbacks
):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.MTC_EXPORT_MEMORY_GB = 0.25  # not even torch fits
    job = completed_job(cluster, user, finished_run, register_as="small")
    version = register(job, django_capture_on_commit_callbacks)
    assert version.state == "FAILED"
    assert "needed more than 0.25 GiB of memory (MTC_EXPORT_MEMORY_GB)" in version.status_message


def test_an_export_past_its_time_limit_fails_and_says_so(
    cluster, user, finished_run, settings, monkeypatch, django_capture_on_commit_callbacks
):
    from registry import export

    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.MTC_EXPORT_TIMEOUT_S = 1
    monkeypatch.setattr(
        export, "export_argv", lambda **kw: [sys.executable, "-c", "import time; time.sleep(60)"]
    )
    job = completed_job(cluster, user, finished_run, register_as="slow")
    version = register(job, django_capture_on_commit_callbacks)
    assert (version.state, version.status_message) == (
        "FAILED",
        "Export failed: it ran past 1 s (MTC_EXPORT_TIMEOUT_S)",
    )
