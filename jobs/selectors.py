"""Reads on jobs: what a user may see, from the database only."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from django.db.models import Count, F, Q, QuerySet, Value

from clusters.models import Cluster
from clusters.runroot import run_root_or_none
from mtc import userfs
from mtc.retention import retention_days
from mtc.retention import tally as retention_tally

from .models import Job, JobMetric

POSIX_NAME_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")

OUTPUT_CHUNK = 64 * 1024


def jobs_visible_to(user, cluster: Cluster) -> QuerySet[Job]:
    """Operators see every job; a user sees only the jobs they submitted."""
    # The cluster is joined for its id; its spec (large JSON) is left behind.
    qs = (
        Job.objects.filter(cluster=cluster)
        .select_related("owner", "cluster")
        .defer("cluster__spec", "cluster__labels")
    )
    return qs if user.is_staff else qs.filter(owner=user)


def job_rows(qs: QuerySet[Job], fields: tuple[str, ...], *, cluster: Cluster) -> QuerySet[dict]:
    """The jobs of ``qs`` (all of ``cluster``) as dicts of ``fields`` plus
    ``cluster_name`` and ``owner_name`` (None for jobs from outside mtc): a list page
    reads no Job, User or Cluster objects. The cluster's name is a constant, not a join:
    with the cluster table joined, SQLite's planner (given ANALYZE's statistics) read
    and sorted every job of the cluster for one page."""
    names = {"cluster_name": Value(cluster.cluster_id), "owner_name": F("owner__username")}
    return qs.values(*fields, **names)


def job_state_counts(qs: QuerySet[Job]) -> dict[str, int]:
    return dict(qs.order_by().values_list("state").annotate(n=Count("id")))


def jobs_retention_days() -> float | None:
    """Days finished jobs are kept (MTC_RETENTION_JOBS_DAYS); None: forever."""
    return retention_days("MTC_RETENTION_JOBS_DAYS")


def jobs_purged_count(cluster: Cluster) -> int:
    """Finished jobs of the cluster the retention purge has removed (jobs.retention)."""
    return retention_tally("jobs", cluster.cluster_id)


def job_output_path(job: Job, stream: str) -> Path | None:
    """The job's own output file, derived from its id; never a path from a request."""
    if not job.submitted_by_mtc:
        return None
    root = run_root_or_none(job.cluster)
    if root is None:
        return None
    # A user's job writes in their own folder (jobs.services.job_root); mtc's own
    # jobs and single-user ones in the cluster's. The file is read through mtc.userfs,
    # which never follows a link the job's owner left there.
    home = root / "users" / job.user if POSIX_NAME_RE.fullmatch(job.user or "") else None
    output_dir = home / "output" if home is not None and userfs.is_dir(home) else root / "output"
    return output_dir / f"slurm-{job.job_id}.{'out' if stream == 'stdout' else 'err'}"


def _whole_characters(data: bytes, *, at_end: bool) -> bytes:
    """Drop a UTF-8 character cut at the chunk's end; the next read starts with it."""
    if at_end:
        return data
    for cut in range(4):
        head = data[: len(data) - cut]
        try:
            head.decode("utf-8")
            return head
        except UnicodeDecodeError as exc:
            if exc.reason != "unexpected end of data":
                return data  # invalid bytes, not a cut character: sent as they are
    return data


def job_output(job: Job, *, stream: str, offset: int, limit: int = OUTPUT_CHUNK) -> dict:
    path = job_output_path(job, stream)
    data, size = b"", 0
    if path is not None:
        try:
            data, size = userfs.read_at(path, offset=offset, limit=limit)
        except OSError:  # not written yet, or not a plain file of the job's owner
            data, size = b"", 0
    data = _whole_characters(data, at_end=offset + len(data) >= size)
    return {
        "stream": stream,
        "offset": offset,
        "next_offset": offset + len(data),
        "size": size,
        "data": data.decode("utf-8", errors="replace"),
        "eof": offset + len(data) >= size,
        "available": path is not None,
    }


# Big columns list pages never show (the queue page, the cluster page's recent jobs).
LIST_DEFERRED = ("script", "options", "parameters", "metrics", "checkpoint_dir")


def jobs_for_list(user, cluster: Cluster) -> QuerySet[Job]:
    """jobs_visible_to without the big text and JSON columns, and without joining the
    cluster (whose spec would be parsed again for every row): callers know it."""
    return (
        jobs_visible_to(user, cluster)
        .select_related(None)
        .select_related("owner")
        .defer(*LIST_DEFERRED)
    )


def tensorboard_viewable_by(user, job_pks: list[int]) -> bool:
    """Each user has a TensorBoard of their own, serving only their runs: a check behind
    the choice of instance that every run it serves is theirs (operators see all)."""
    if user.is_staff:
        return True
    return not Job.objects.filter(pk__in=job_pks).exclude(owner=user).exists()


def tensorboard_runs_exist_for(user, cluster_id: str) -> bool:
    """Whether the user has recipe runs on the cluster a TensorBoard could show."""
    qs = Job.objects.filter(cluster__cluster_id=cluster_id).exclude(recipe="")
    return user.is_staff or qs.filter(owner=user).exists()


def jobs_by_refs(user, refs: list[tuple[str, str]]) -> dict[tuple[str, str], Job]:
    """{(cluster_id, job_id): job} for the refs the user may see, in one query; unknown
    and forbidden refs are simply missing."""
    if not refs:
        return {}
    match = Q()
    for cluster_id, job_id in refs:
        match |= Q(cluster__cluster_id=cluster_id, job_id=job_id)
    qs = Job.objects.filter(match).select_related("cluster").defer("script", "cluster__spec")
    if not user.is_staff:
        qs = qs.filter(owner=user)
    return {(job.cluster.cluster_id, job.job_id): job for job in qs}


def recipe_jobs_recent(user, *, limit: int = 30) -> list[Job]:
    """The newest recipe jobs the user may see, on every cluster (the comparison's picker)."""
    qs = (
        Job.objects.exclude(recipe="")
        .select_related("cluster")
        .only("job_id", "name", "recipe", "state", "submit_time", "cluster__cluster_id")
        .order_by("-id")
    )
    if not user.is_staff:
        qs = qs.filter(owner=user)
    return list(qs[:limit])


METRIC_POINTS = 1000  # points a series gets unless asked for another number
METRIC_POINTS_MAX = 10_000


@dataclass
class MetricWindow:
    """A job's metric points between two steps, at most ``points`` of them: every one
    when there are no more, else an even stride over the steps (first and last kept)."""

    rows: list[tuple[int, datetime | None, dict]]  # (step, time, values), in step order
    first_step: int | None
    last_step: int | None
    stride: int  # 1: every stored step
    downsampled: bool


def job_metric_points(
    job_pk: int,
    *,
    points: int = METRIC_POINTS,
    start_step: int | None = None,
    end_step: int | None = None,
) -> MetricWindow:
    """A bounded read of a run that may have millions of steps: a few index lookups,
    never a scan of the run's rows, when the steps are evenly spaced (metrics.jsonl has
    every step); one pass over the steps' numbers (not their values) when they are not."""
    points = max(3, min(points, METRIC_POINTS_MAX))
    qs = JobMetric.objects.filter(job_id=job_pk)
    if start_step is not None:
        qs = qs.filter(step__gte=start_step)
    if end_step is not None:
        qs = qs.filter(step__lte=end_step)
    columns = ("step", "time", "values")
    head = list(qs.order_by("step", "id").values_list(*columns)[: points + 1])
    if len(head) <= points:
        return MetricWindow(
            rows=_one_per_step(head),
            first_step=head[0][0] if head else None,
            last_step=head[-1][0] if head else None,
            stride=1,
            downsampled=False,
        )
    first = head[0][0]
    last = qs.order_by("-step", "-id").values_list("step", flat=True)[0]
    # The spacing of the stored steps (1 when every step is logged), from the head.
    gaps = [b[0] - a[0] for a, b in zip(head, head[1:], strict=False) if b[0] > a[0]]
    spacing = min(gaps) if gaps else 1
    stride = max(spacing, math.ceil((last - first) / (points - 2)))
    stride = math.ceil(stride / spacing) * spacing
    targets = sorted({*range(first, last + 1, stride), last})
    rows = _one_per_step(
        list(qs.filter(step__in=targets).order_by("step", "id").values_list(*columns))
    )
    if len(rows) < len(targets) // 2:
        # Uneven steps: every k-th stored step by position, from one streamed pass
        # over the step numbers (the index), never holding them all.
        numbers = qs.order_by("step").values_list("step", flat=True).distinct()
        k = math.ceil(numbers.count() / (points - 1))
        chosen = {last}
        for i, step in enumerate(numbers.iterator(chunk_size=10_000)):
            if i % k == 0:
                chosen.add(step)
        rows = _one_per_step(
            list(qs.filter(step__in=chosen).order_by("step", "id").values_list(*columns))
        )
        stride = k
    return MetricWindow(
        rows=rows, first_step=first, last_step=last, stride=stride, downsampled=True
    )


def _one_per_step(rows: list[tuple]) -> list[tuple]:
    """The last stored row of each step (a resumed run may have written one twice)."""
    by_step: dict[int, tuple] = {}
    for row in rows:
        by_step[row[0]] = row
    return [
        (step, time, values if isinstance(values, dict) else {})
        for step, time, values in by_step.values()
    ]


def job_metric_series(jobs: list[Job], *, points: int = METRIC_POINTS) -> dict[int, list[tuple]]:
    """{job pk: [(step, time, values), ...]}, at most ``points`` per job, in one query for
    runs that log every step (the steps to read follow from each job's latest step, in
    its summary); a run whose steps are uneven gets its own job_metric_points read."""
    points = max(4, min(points, METRIC_POINTS_MAX))
    targets: dict[int, list[int]] = {}
    match = Q()
    for job in jobs:
        last = (job.metrics or {}).get("step")
        if isinstance(last, int) and not isinstance(last, bool) and last >= 0:
            # Runs count from step 0 or 1: both are asked for, so the first is kept.
            stride = max(1, math.ceil(last / (points - 3)))
            targets[job.pk] = sorted({*range(0, last + 1, stride), 1, last})
            match |= Q(job_id=job.pk, step__in=targets[job.pk])
    found: dict[int, list[tuple]] = {job.pk: [] for job in jobs}
    if targets:
        rows = (
            JobMetric.objects.filter(match)
            .order_by("job_id", "step", "id")
            .values_list("job_id", "step", "time", "values")
        )
        for job_pk, step, time, values in rows:
            found[job_pk].append((step, time, values))
    series = {}
    for job in jobs:
        wanted = targets.get(job.pk)
        rows = _one_per_step(found[job.pk])
        if wanted is None or len(rows) < len(wanted) // 2:
            rows = job_metric_points(job.pk, points=points).rows
        series[job.pk] = rows
    return series
