"""Reads on jobs: what a user may see, from the database only."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings
from django.db.models import Count, Q, QuerySet

from clusters.models import Cluster

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


def job_state_counts(qs: QuerySet[Job]) -> dict[str, int]:
    return dict(qs.order_by().values_list("state").annotate(n=Count("id")))


def job_output_path(job: Job, stream: str) -> Path | None:
    """The job's own output file, derived from its id; never a path from a request."""
    if not job.submitted_by_mtc:
        return None
    root = Path(settings.DATA_DIR) / "clusters" / job.cluster.cluster_id
    # A user's job writes in their own folder (jobs.services.job_root); mtc's own
    # jobs and single-user ones in the cluster's.
    users = root / "users"
    own = users / job.user / "output" if POSIX_NAME_RE.fullmatch(job.user or "") else None
    output_dir = own if own is not None and own.is_dir() else root / "output"
    path = output_dir / f"slurm-{job.job_id}.{'out' if stream == 'stdout' else 'err'}"
    return path if path.resolve().parent == output_dir.resolve() else None


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
    if path is not None and path.exists():
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            if offset < size:
                fh.seek(offset)
                data = fh.read(limit)
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


def job_metric_series(job_pks: list[int]) -> dict[int, list[tuple[int, dict]]]:
    """{job pk: [(step, values), ...] in step order} for all the jobs, in one query."""
    series: dict[int, list[tuple[int, dict]]] = {pk: [] for pk in job_pks}
    rows = (
        JobMetric.objects.filter(job_id__in=job_pks)
        .order_by("job_id", "step", "id")
        .values_list("job_id", "step", "values")
    )
    for job_pk, step, values in rows:
        series[job_pk].append((step, values if isinstance(values, dict) else {}))
    return series


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
