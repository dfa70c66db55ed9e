"""Writes on jobs: submit, control (cancel/requeue/hold/release), and the poller's sync."""

from __future__ import annotations

import dataclasses
import getpass
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from clusters import accounts as slurm_accounts
from clusters.choices import CLUSTER_LIVE_STATES
from clusters.models import Cluster
from clusters.providers import get_provider
from clusters.runroot import is_own_dir, run_root
from identity.services import account_ensure
from mtc import userfs
from slurm import SlurmError
from slurm.accounts import USER_RE
from slurm.submit import Submission, sbatch_args, validate_submission

from .choices import CAN_CANCEL, CAN_HOLD, CAN_REQUEUE, HELD_REASONS, INTERRUPTED, JobState
from .models import Job, JobEvent
from .sync import apply_queue_job

log = logging.getLogger(__name__)


class JobConflict(Exception):
    """The job's or cluster's state does not allow this (HTTP 409)."""


class FolderConflict(JobConflict):
    """A folder mtc must use in the owner's tree is not a plain folder of theirs (a link,
    a FIFO, another uid's): HTTP 409, and nothing was followed, made or changed there."""


@contextmanager
def owner_folders() -> Iterator[None]:
    """mtc.userfs's refusals, said to the user whose folder it is."""
    try:
        yield
    except userfs.UnsafePath as exc:
        raise FolderConflict(
            f"{exc.path} {exc.why}. mtc never follows a link or takes over a file in a "
            "user's folder: move it away and try again."
        ) from exc


def job_root(cluster: Cluster, account=None, *, make: bool = True) -> Path:
    """Where a user's jobs keep their output, work and runs: ``users/<name>/`` of the
    cluster, the account's alone (0700); the cluster's own folder for mtc's jobs and
    in single-user mode. ``make=False``: only the path (a preview writes nothing)."""
    root = run_root(cluster)  # NoRunRoot (400 naming storage) when it has none
    if account is None or not account.isolated:
        return root
    if not make:
        return root / "users" / account.name
    # mtc opens its own data dir's folders to passers-by; a run root the spec names is
    # made (0711) but its parents are the site's (/home, a Lustre mount), left as they are.
    above = [root.parent] if is_own_dir(cluster, root) else []
    with owner_folders():
        for path in (*above, root, root / "users"):
            userfs.dir_pass(path)
        return userfs.dir_own(root / "users" / account.name, account)


def cluster_job_dirs(cluster: Cluster, account=None) -> tuple[Path, Path]:
    """Where the jobs write their output, and their working directory."""
    root = job_root(cluster, account)
    output, work = root / "output", root / "work"
    with owner_folders():
        for path in (output, work):
            if account is not None and account.isolated:
                userfs.dir_own(path, account)
            else:  # mtc's own jobs, single-user mode: the cluster's folder
                userfs.dir_pass(path, mode=0o755)
    return output, work


def job_account(owner):
    """The owner's POSIX account (made on their first submit); None for mtc's own jobs.
    Raises IdentityMissing (HTTP 403)."""
    return account_ensure(user=owner) if owner is not None else None


def cluster_partitions(cluster: Cluster) -> list[str]:
    return [p["id"] for p in cluster.spec["orchestrator_spec"]["slurm_spec"]["partitions"]]


def _limits(cluster: Cluster) -> tuple[int, int]:
    pools = [
        p
        for p in cluster.spec["node_pools"]
        if p["id"] != cluster.spec["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"]
    ]
    nodes = sum(p["scaling_spec"]["max_node_count"] for p in pools)
    gpus = max((p["machine_spec"].get("accelerator_count", 0) or 0 for p in pools), default=0)
    return nodes, gpus


def job_validate(*, cluster: Cluster, data) -> Submission:
    """Check a submission against the cluster; raises SubmissionError."""
    max_nodes, max_gpus = _limits(cluster)
    return validate_submission(
        data,
        partitions=cluster_partitions(cluster),
        max_nodes=max_nodes,
        max_gpus_per_node=max_gpus,
    )


def job_sbatch_args(*, cluster: Cluster, owner, submission: Submission, make: bool = True):
    """The sbatch argument list the submission goes with (a preview passes make=False:
    the same list, and no folder is made)."""
    return _sbatch_args(cluster, owner, job_account(owner), submission, make=make)


def _sbatch_args(cluster: Cluster, owner, account, submission: Submission, *, make: bool):
    if make:
        output_dir, work_dir = cluster_job_dirs(cluster, account)
    else:
        root = job_root(cluster, account, make=False)
        output_dir, work_dir = root / "output", root / "work"
    return sbatch_args(
        submission,
        output_dir=str(output_dir),
        work_dir=str(work_dir),
        comment=f"mtc-owner={owner.username}" if owner else "mtc",
    )


def job_submit(
    *,
    cluster: Cluster,
    owner,
    submission: Submission,
    recipe: str = "",
    parameters: dict | None = None,
    checkpoint_dir: str = "",
) -> Job:
    """sbatch the job (script on stdin) as its owner's account and record it. Raises
    SlurmError, JobConflict, IdentityMissing or AccountError (a FieldErrors)."""
    if cluster.state not in CLUSTER_LIVE_STATES:
        raise JobConflict(
            f"Cluster '{cluster.cluster_id}' is {cluster.state}; jobs need it RUNNING."
        )
    run_root(cluster)  # NoRunRoot (400 naming storage) before anything is asked of Slurm
    # Which Slurm account (AccountError naming `account` when not theirs): checked
    # before anything is made; its association is made on the first job there.
    chosen = slurm_accounts.account_choose(user=owner, account=submission.account)
    account = job_account(owner)
    run_as = account if account is not None and account.isolated else None
    if owner is not None:
        submission = dataclasses.replace(submission, account=chosen)
        slurm_accounts.association_ensure(cluster=cluster, account=chosen, user=account.name)
    elif (me := getpass.getuser()) != "root" and USER_RE.fullmatch(me):
        # mtc's own job runs as mtc, which needs an association too (root has one).
        slurm_accounts.association_ensure(
            cluster=cluster, account=settings.MTC_DEFAULT_ACCOUNT, user=me
        )
    args = _sbatch_args(cluster, owner, account, submission, make=True)  # its account, once
    env = {**submission.env, "MTC_CLUSTER": cluster.cluster_id}
    client = get_provider(cluster.provider).slurm(cluster)
    job_id = client.submit(args, submission.script, env, run_as=run_as)
    now = timezone.now()
    number = int(job_id.split("_")[0])
    fields = dict(
        job_number=number,
        array_task_id=None,
        name=submission.name,
        user=account.name if account is not None else "",  # what squeue will say
        partition=submission.partition,
        state=JobState.PENDING,
        nodes=submission.nodes,
        gpus_per_node=submission.gpus_per_node,
        time_limit=submission.time_limit,
        submit_time=now,
        owner=owner,
        submitted_by_mtc=True,
        script=submission.script,
        options=submission.as_options(),
        recipe=recipe,
        parameters=parameters or {},
        checkpoint_dir=checkpoint_dir,
    )
    with transaction.atomic():
        try:
            with transaction.atomic():
                job = Job.objects.create(cluster=cluster, job_id=str(number), **fields)
        except IntegrityError:  # Slurm reused an id after its state was wiped
            Job.objects.filter(cluster=cluster, job_id=str(number)).delete()
            job = Job.objects.create(cluster=cluster, job_id=str(number), **fields)
        JobEvent.objects.create(
            job=job,
            time=now,
            state=JobState.PENDING,
            cause=f"submitted by {owner.username if owner else 'mtc'}",
        )
    return job


ACTIONS = {
    "cancel": (CAN_CANCEL, "cancelled"),
    "requeue": (CAN_REQUEUE, "requeued"),
    "hold": (CAN_HOLD, "held"),
    "release": ({JobState.PENDING}, "released"),
}


def job_control(*, job: Job, action: str, actor) -> Job:
    """Cancel, requeue, hold or release. Raises JobConflict when the state forbids it."""
    allowed, verb = ACTIONS[action]
    held = job.reason in HELD_REASONS
    if (
        job.state not in allowed
        or (action == "release" and not held)
        or (action == "hold" and held)
    ):
        raise JobConflict(
            f"Job {job.job_id} is {job.state}"
            + (f" ({job.reason})" if job.reason else "")
            + f"; it cannot be {verb}."
        )
    client = get_provider(job.cluster.provider).slurm(job.cluster)
    try:
        client.control(action, job.job_id)
    except SlurmError as exc:
        if exc.permanent:  # Slurm disagrees with our (older) view of the job
            raise JobConflict(f"Slurm refused to {action} job {job.job_id}: {exc}") from exc
        raise
    now = timezone.now()
    JobEvent.objects.create(
        job=job,
        time=now,
        state=job.state,
        cause=f"{action} requested by {getattr(actor, 'username', actor)}",
    )
    fresh = client.job(job.job_id)
    if fresh is not None:
        apply_queue_job(job, fresh, now=now, cause=f"after {action}")
    return job


# How long a job requeued by anyone but mtc (its own batch script after SIGUSR1 and a
# checkpoint, a user, Slurm) stays held before mtc starts it. Its old batch script may
# still be ending when the requeue is through; if the job ran again first, that script's
# completion would reach slurmctld during the new run and end it FAILED with the old
# exit code (seen on a loaded host: PENDING BeginTime, then FAILED NonZeroExitCode and no
# output from the second run). Slurm's own hold (BeginTime) is two minutes.
REQUEUE_SETTLE_S = 10.0


def jobs_release_requeued(*, cluster: Cluster) -> int:
    """Slurm holds a requeued job back for about two minutes (reason BeginTime); mtc
    starts its requeued jobs again sooner: one mtc requeued (an "interrupted:" event since
    its last run began) as soon as its earlier run's batch script cannot end the new run
    (``requeued_startable``), any job REQUEUE_SETTLE_S after the poller first saw it held.
    Returns how many it asked Slurm to start."""
    held = list(
        Job.objects.filter(
            cluster=cluster,
            state=JobState.PENDING,
            reason="BeginTime",
            requeue_count__gt=0,
        )
        .order_by()  # jobs.sync._rows: Job's ordering would make SQLite walk the history
        .values_list("id", "job_id")
    )
    if not held:
        return 0
    by_mtc, settled = _release_due([pk for pk, _ in held], timezone.now())
    ready = {job_id for pk, job_id in held if pk in settled}
    asked = [job_id for pk, job_id in held if pk in by_mtc and pk not in settled]
    if not (ready or asked):
        return 0
    client = get_provider(cluster.provider).slurm(cluster)
    ready |= requeued_startable(client, asked)
    for job_id in sorted(ready):
        client.job_start_now(job_id)
    return len(ready)


NO_NEW_WORK = {"DRAIN", "NOT_RESPONDING"}  # Slurm node flags: no job starts there


def requeued_startable(client, job_ids: list[str]) -> set[str]:
    """The requeued jobs whose earlier run can no longer end the new one. slurmctld takes
    a batch script's completion from the job's batch host as the job's end: an earlier
    run's script whose completion arrives while the new run runs on that same node ends
    the new run FAILED with the old exit code (seen under load: a hung job's new run
    ended so, without a line of output). Startable: accounting has the earlier script's
    end, or its node cannot take the new run (down, drained, not responding). Without an
    answer (no accounting, slurmdbd behind) none is: REQUEUE_SETTLE_S covers them."""
    if not job_ids:
        return set()
    try:
        ends = client.batch_ends(job_ids)
    except SlurmError as exc:
        log.info("requeued jobs %s wait: %s", ",".join(job_ids), exc)
        return set()
    ready = {job_id for job_id, end in ends.items() if end.ended}
    open_hosts = {job_id: end.host for job_id, end in ends.items() if not end.ended}
    if open_hosts:
        try:
            nodes = {node.name: node for node in client.nodes()}
        except SlurmError:
            return ready
        for job_id, host in open_hosts.items():
            node = nodes.get(host)
            if node is None or node.state == "DOWN" or NO_NEW_WORK & set(node.flags):
                ready.add(job_id)
    return ready


def _release_due(job_pks: list[int], now) -> tuple[set[int], set[int]]:
    """From the held requeued jobs' events since each one's last run began (one query):
    those mtc requeued, and those the poller has seen held for REQUEUE_SETTLE_S."""
    by_mtc: set[int] = set()
    held_since: dict[int, object] = {}
    events = (
        JobEvent.objects.filter(job_id__in=job_pks)
        .order_by("time", "id")
        .values_list("job_id", "time", "state", "reason", "cause")
    )
    for pk, when, state, reason, cause in events:
        if state == JobState.RUNNING:  # a run began: what came before is another requeue's
            by_mtc.discard(pk)
            held_since.pop(pk, None)
        elif cause.startswith(INTERRUPTED):
            by_mtc.add(pk)
        elif state == JobState.PENDING and reason == "BeginTime":
            held_since.setdefault(pk, when)
    settled = {
        pk for pk, since in held_since.items() if (now - since).total_seconds() >= REQUEUE_SETTLE_S
    }
    return by_mtc, settled
