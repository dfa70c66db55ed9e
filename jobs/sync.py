"""The poller's half: one squeue per cluster, stored in bulk."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime

from django.db import models, transaction
from django.utils import timezone

from clusters.models import Cluster
from clusters.providers import get_provider
from mtc.db import bulk_insert, bulk_update
from slurm import SlurmError
from slurm.queue import QueueJob

from .choices import ACTIVE_STATES, JobState
from .models import Job, JobEvent

log = logging.getLogger(__name__)

# Fields the poller owns, copied from squeue onto the row.
SYNCED = (
    "name",
    "user",
    "partition",
    "state",
    "reason",
    "nodes",
    "node_list",
    "cpus",
    "gpus_per_node",
    "time_limit",
    "submit_time",
    "start_time",
    "end_time",
    "exit_code",
)
# Fields an array task takes from the array's own row (what mtc knows, Slurm does not).
INHERITED = ("owner_id", "submitted_by_mtc", "recipe", "options", "parameters")
# Most telling first: the state an array shows while its tasks differ.
ARRAY_STATE_ORDER = [
    JobState.RUNNING,
    JobState.COMPLETING,
    JobState.CONFIGURING,
    JobState.PENDING,
    JobState.REQUEUED,
    JobState.SUSPENDED,
]


# squeue's text has no such bounds (a name set with sbatch -J may be 1024 characters, a
# scattered node list longer than 500): cut to the column, which PostgreSQL enforces.
_LIMITS = {
    field.name: field.max_length
    for field in map(Job._meta.get_field, SYNCED)
    if isinstance(field, models.CharField)
}


def _fit(q: QueueJob) -> QueueJob:
    cut = {name: getattr(q, name)[:n] for name, n in _LIMITS.items() if len(getattr(q, name)) > n}
    return replace(q, **cut) if cut else q


def _changes(job: Job, q: QueueJob) -> list[str]:
    changed = [f for f in SYNCED if getattr(job, f) != getattr(q, f)]
    if q.restart_count > job.requeue_count:
        changed.append("requeue_count")
    return changed


def _copy(job: Job, q: QueueJob, now: datetime) -> None:
    for f in SYNCED:
        setattr(job, f, getattr(q, f))
    job.requeue_count = max(job.requeue_count, q.restart_count)
    job.update_time = now


def apply_queue_job(job: Job, q: QueueJob, *, now: datetime, cause: str = "") -> list[str]:
    """Copy one squeue line onto a row (and its history); return the changed fields."""
    old_state, old_reason = job.state, job.reason
    q = _fit(q)
    changed = _changes(job, q)
    if changed:
        _copy(job, q, now)
        job.save(update_fields=[*changed, "update_time"])
        if job.state != old_state or job.reason != old_reason:
            JobEvent.objects.create(
                job=job, time=now, state=job.state, reason=job.reason, cause=cause
            )
    return changed


def _array_state(states: list[str]) -> str:
    for state in ARRAY_STATE_ORDER:
        if state in states:
            return state
    failed = [s for s in states if s != JobState.COMPLETED]
    return failed[0] if failed else JobState.COMPLETED


def jobs_sync(*, cluster: Cluster, queue: list[QueueJob] | None = None) -> dict[str, int]:
    """Read the queue once and upsert every job. A job mtc thought active that left the
    queue becomes UNKNOWN (there is no accounting database to ask how it ended)."""
    if queue is None:
        try:
            queue = get_provider(cluster.provider).slurm(cluster).queue()
        except SlurmError as exc:
            log.info("squeue for %s failed: %s", cluster.cluster_id, exc)
            return {"created": 0, "updated": 0, "gone": 0}
    queue = [_fit(q) for q in queue]
    now = timezone.now()
    existing = {
        job.job_id: job
        for job in Job.objects.filter(cluster=cluster).only(
            "id", "job_id", "job_number", "array_task_id", "requeue_count", "recipe", *SYNCED
        )
    }
    task_states: dict[int, list[str]] = {}
    for q in queue:
        if q.array_task_id is not None:
            task_states.setdefault(q.job_number, []).append(q.state)
    parents = {number: existing[str(number)] for number in task_states if str(number) in existing}
    inherited = {
        row["id"]: row
        for row in Job.objects.filter(pk__in=[p.pk for p in parents.values()]).values(
            "id", *INHERITED
        )
    }

    new_rows: list[dict] = []
    updated: dict[int, Job] = {}
    fields: set[str] = {"update_time"}
    events: list[dict] = []
    held: list[str] = []
    for q in queue:
        job = existing.get(q.job_id)
        if job is None:
            row = {f: getattr(q, f) for f in SYNCED}
            row.update(
                cluster_id=cluster.pk,
                job_id=q.job_id,
                job_number=q.job_number,
                array_task_id=q.array_task_id,
                requeue_count=q.restart_count,
                update_time=now,
            )
            parent = parents.get(q.job_number) if q.array_task_id is not None else None
            if parent is not None:
                row.update({k: v for k, v in inherited[parent.pk].items() if k != "id"})
            new_rows.append(row)
            continue
        changed = _changes(job, q)
        if changed:
            if _held_after_requeue(job, q):
                held.append(q.job_id)
            if job.state != q.state or job.reason != q.reason:
                events.append(_event(job.pk, now, q.state, q.reason, "seen by the poller"))
            _copy(job, q, now)
            fields.update(changed)
            updated[job.pk] = job

    seen = {q.job_id for q in queue}
    gone = 0
    for job_id, job in existing.items():
        if job_id in seen:
            continue
        if job.job_number in parents and job.array_task_id is None:
            state = _array_state(task_states[job.job_number])  # the array's own row
            reason = ""
        elif job.state in ACTIVE_STATES:
            state, reason = JobState.UNKNOWN, "Left the queue unseen"
            gone += 1
        else:
            continue
        if job.state != state or job.reason != reason:
            cause = "no longer in Slurm's queue" if reason else "array tasks"
            events.append(_event(job.pk, now, state, reason, cause))
            job.state, job.reason, job.update_time = state, reason, now
            fields.update({"state", "reason"})
            updated[job.pk] = job

    with transaction.atomic():
        if new_rows:
            bulk_insert(Job, new_rows)
            new_ids = Job.objects.filter(cluster=cluster, update_time=now).values_list(
                "id", "job_id"
            )
            by_job_id = {row["job_id"]: row for row in new_rows}
            events += [
                _event(
                    pk,
                    now,
                    by_job_id[job_id]["state"],
                    by_job_id[job_id]["reason"],
                    "seen by the poller",
                )
                for pk, job_id in new_ids
                if job_id in by_job_id
            ]
        bulk_update(list(updated.values()), sorted(fields))
        bulk_insert(JobEvent, events)
    if held:
        _start_now(cluster, held)
    return {"created": len(new_rows), "updated": len(updated) - gone, "gone": gone}


def _event(job_pk: int, now: datetime, state: str, reason: str, cause: str) -> dict:
    return {"job_id": job_pk, "time": now, "state": state, "reason": reason, "cause": cause}


def _held_after_requeue(job: Job, q: QueueJob) -> bool:
    """A recipe job its batch script requeued (after SIGUSR1 and a checkpoint), newly held
    back by Slurm's BeginTime (its credential lifetime, two minutes): mtc starts the jobs
    it requeues itself at once, and these too."""
    return (
        bool(job.recipe)
        and q.state == JobState.PENDING
        and q.reason == "BeginTime"
        and q.restart_count > 0
        and job.reason != "BeginTime"
    )


def _start_now(cluster: Cluster, job_ids: list[str]) -> None:
    client = get_provider(cluster.provider).slurm(cluster)
    for job_id in job_ids:
        try:
            client.job_start_now(job_id)
        except SlurmError as exc:  # best effort: Slurm starts it after the hold anyway
            log.info("starting requeued job %s now failed: %s", job_id, exc)
