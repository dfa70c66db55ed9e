"""The poller's half: one squeue per cluster, stored in bulk; the jobs that ended or
left the queue get their final record from accounting (settle.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime
from itertools import chain

from django.db import models, transaction
from django.utils import timezone

from clusters.models import Cluster
from clusters.providers import get_provider
from mtc.db import bulk_insert, bulk_update
from slurm import SlurmError
from slurm.accounting import AcctJob
from slurm.queue import QueueJob

from .choices import ACTIVE_STATES
from .models import UNSETTLED, Job, JobEvent
from .settle import RECORD_FIELDS, array_state, asked_once, settle, settle_ended

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
    "expected_start_time",
)
# Fields an array task takes from the array's own row (what mtc knows, Slurm does not).
INHERITED = ("owner_id", "submitted_by_mtc", "recipe", "options", "parameters")
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


# Ids per `job_id IN (...)` query: under every database's parameter limit.
ID_CHUNK = 5000


def _by_ids(qs, ids: list[str]) -> Iterator:
    """``qs`` for the rows of ``ids`` (found by the unique index), ID_CHUNK a query."""
    for start in range(0, len(ids), ID_CHUNK):
        yield from qs.filter(job_id__in=ids[start : start + ID_CHUNK])


def _rows(cluster: Cluster, queue: list[QueueJob]) -> tuple[dict[str, Job], set[str]]:
    """The rows a round touches: the unsettled ones (mtc still waits for their end or
    their final record) and the queue's own (array parents included), never the whole
    history; and the ids of the queue's ended jobs that already settled (slurmctld keeps
    an ended job for MinJobAge: 5 minutes of a busy cluster's history, which the round
    skips, reading no more than their requeue counts)."""
    base = Job.objects.filter(cluster=cluster).only(
        "id",
        "job_id",
        "job_number",
        "array_task_id",
        "requeue_count",
        "settled",
        "gone_time",
        *SYNCED,
        *RECORD_FIELDS,
    )
    # No ORDER BY (Job's default one): SQLite would walk the whole history in the
    # (cluster, job number) index to skip a sort, instead of using the index that finds
    # the few rows asked for (the unsettled ones, or ids through the unique one).
    base = base.order_by()
    rows = {job.job_id: job for job in base.filter(UNSETTLED)}
    ended = {q.job_id: q.restart_count for q in queue if q.state not in ACTIVE_STATES}
    done: set[str] = set()
    ids = sorted(ended.keys() - rows.keys())
    for job_id, requeues in _by_ids(base.values_list("job_id", "requeue_count"), ids):
        if ended[job_id] <= requeues:  # not run again since it settled
            done.add(job_id)
    wanted = {q.job_id for q in queue if q.job_id not in done}
    wanted |= {str(q.job_number) for q in queue if q.array_task_id is not None}
    ids = sorted(wanted - rows.keys())
    rows.update((job.job_id, job) for job in _by_ids(base, ids))
    return rows, done


def jobs_sync(
    *,
    cluster: Cluster,
    queue: list[QueueJob] | None = None,
    accounting: Callable[[list[str]], dict[str, AcctJob]] | None = None,
) -> dict[str, int]:
    """Read the queue once and upsert every job in it. The unsettled jobs that left it
    get their final record from accounting, one sacct call for all of them
    (``accounting``: job ids -> records; the cluster's sacct by default)."""
    client = None
    if queue is None:
        client = get_provider(cluster.provider).slurm(cluster)
        try:
            queue = client.queue()
        except SlurmError as exc:
            log.info("squeue for %s failed: %s", cluster.cluster_id, exc)
            return {"created": 0, "updated": 0, "gone": 0}
    now = timezone.now()
    existing, done = _rows(cluster, queue)
    task_states: dict[int, list[str]] = {}  # an array's state follows all its tasks
    for q in queue:
        if q.array_task_id is not None:
            task_states.setdefault(q.job_number, []).append(q.state)
    queue = [_fit(q) for q in queue if q.job_id not in done]
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
        if job.gone_time is not None:  # back in the queue (requeued, or a glitch)
            job.gone_time = None
            changed.append("gone_time")
        if job.settled:  # it runs again (requeued after it ended): its end is to come
            job.settled = False
            changed.append("settled")
        if changed:
            if job.state != q.state or job.reason != q.reason:
                events.append(_event(job.pk, now, q.state, q.reason, "seen by the poller"))
            _copy(job, q, now)
            fields.update(changed)
            updated[job.pk] = job

    seen = {q.job_id for q in queue}
    leavers = []
    for job_id, job in existing.items():
        if job_id in seen or job.settled:
            continue
        if job.job_number in parents and job.array_task_id is None:
            state = array_state(task_states[job.job_number])  # the array's own row
            if job.state != state or job.reason:
                events.append(_event(job.pk, now, state, "", "array tasks"))
                job.state, job.reason, job.update_time = state, "", now
                fields.update({"state", "reason"})
                updated[job.pk] = job
        else:
            leavers.append(job)
    # Ended in the queue, not settled yet: their final record settles them now.
    ended = [
        existing[q.job_id] for q in queue if q.state not in ACTIVE_STATES and q.job_id in existing
    ]
    gone = sum(job.state in ACTIVE_STATES for job in leavers)
    if leavers or ended:
        if accounting is None:
            accounting = (client or get_provider(cluster.provider).slurm(cluster)).accounting
        answer = asked_once(accounting, [job.job_id for job in leavers + ended])
        for job, changed, event in chain(
            settle(leavers, answer, now=now), settle_ended(ended, answer, now=now)
        ):
            if not changed:
                continue
            fields.update(changed)
            updated[job.pk] = job
            if event:
                events.append(event)

    if new_rows or updated or events:  # a quiet round writes nothing
        with transaction.atomic():
            if new_rows:
                # A submit may have recorded one of them since `existing` was read (sbatch
                # answered, squeue showed it, the submit's row committed): its row stands.
                bulk_insert(Job, new_rows, skip_existing=True)
                by_job_id = {row["job_id"]: row for row in new_rows}
                # Found by id through the unique index, this round's own by update_time:
                # by update_time alone SQLite read every job the cluster ever had, with
                # the database's write lock held (every submit waited behind it).
                mine = Job.objects.filter(cluster=cluster, update_time=now).order_by()
                new_ids = list(_by_ids(mine.values_list("id", "job_id"), sorted(by_job_id)))
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
    leaver_pks = {job.pk for job in leavers}
    updates = sum(1 for pk in updated if pk not in leaver_pks)
    return {"created": len(new_rows), "updated": updates, "gone": gone}


def _event(job_pk: int, now: datetime, state: str, reason: str, cause: str) -> dict:
    return {"job_id": job_pk, "time": now, "state": state, "reason": reason, "cause": cause}
