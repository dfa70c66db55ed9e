"""The purge of finished jobs past MTC_RETENTION_JOBS_DAYS: each job's row with its
events, metric points, output files and (through jobs.extensions.job_file_parts) a
recipe run's directory. Registered with mtc.retention from JobsConfig.ready()."""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path

from django.db import transaction
from django.db.models import Q, QuerySet

from clusters.runroot import run_root_or_none
from mtc.retention import Budget, batched_delete, path_remove, tally_add, tally_clear

from . import extensions
from .choices import TERMINAL_STATES
from .models import Job, JobEvent, JobMetric
from .selectors import job_output_path

log = logging.getLogger(__name__)
JOBS_BATCH = 200  # jobs a round; their metric points and events go 1,000 rows a DELETE


def jobs_expired(cutoff: datetime) -> QuerySet[Job]:
    """Finished jobs that ended before ``cutoff`` (or, with no end time Slurm gave, were
    last updated before it), less those an app above keeps (extensions.job_keep_parts:
    a job a model version came from, whose run directory holds its checkpoint)."""
    qs = Job.objects.filter(state__in=TERMINAL_STATES).filter(
        Q(end_time__lt=cutoff) | Q(end_time__isnull=True, update_time__lt=cutoff)
    )
    for keep in extensions.job_keep_parts:
        qs = qs.exclude(keep())
    return qs


def job_files(job: Job) -> list[Path]:
    """What the job left in its cluster's folder: its output files, then the parts'."""
    paths = [job_output_path(job, stream) for stream in ("stdout", "stderr")]
    for part in extensions.job_file_parts:
        paths.extend(part(job))
    return [Path(p) for p in paths if p]


def jobs_purge(cutoff: datetime, budget: Budget) -> int:
    """Remove expired jobs, JOBS_BATCH at a time, until none is left or the budget is
    spent. A job's points and events go first, in batches (a run may have millions of
    steps); its row goes last, guarded on its state, and only then its files: a job
    that came back to life meanwhile keeps everything. Returns the jobs removed."""
    removed = 0
    while not budget.spent:
        jobs = list(
            jobs_expired(cutoff)
            .select_related("cluster")
            .only(
                "id",
                "job_id",
                "user",
                "submitted_by_mtc",
                "checkpoint_dir",
                "recipe",
                "cluster__cluster_id",
            )
            .order_by("pk")[:JOBS_BATCH]
        )
        if not jobs:
            break
        pks = [job.pk for job in jobs]
        batched_delete(JobMetric.objects.filter(job_id__in=pks), budget)
        batched_delete(JobEvent.objects.filter(job_id__in=pks), budget)
        if budget.spent:
            break  # the rows stay; the next run goes on where this one stopped
        # (Slurm forgets a job minutes after it ends, so one expired days ago cannot
        # be requeued; the guard below is for the rows, the points are history.)
        with transaction.atomic():
            jobs_expired(cutoff).filter(pk__in=pks).delete()  # every condition again
            kept = set(Job.objects.filter(pk__in=pks).values_list("pk", flat=True))
            gone = [job for job in jobs if job.pk not in kept]
            per_cluster: dict[str, int] = {}
            for job in gone:
                per_cluster[job.cluster.cluster_id] = per_cluster.get(job.cluster.cluster_id, 0) + 1
            tally_add("jobs", per_cluster)
        for job in gone:
            root = run_root_or_none(job.cluster)
            for path in job_files(job) if root is not None else ():
                path_remove(path, root=root)
        removed += len(gone)
        if len(jobs) < JOBS_BATCH:
            break
    return removed


def cluster_jobs_clear(sender, *, cluster_id: str, **kwargs) -> None:
    """The cluster_deleting receiver: the cluster's metric points and job events go in
    batches before its rows cascade (a run's millions of points in one statement would
    hold the lock for minutes), and its purge tally with them (a new cluster of the same
    id starts from nothing). Safe to run twice, as the delete operation may."""
    unbounded = Budget(float("inf"))
    batched_delete(JobMetric.objects.filter(job__cluster__cluster_id=cluster_id), unbounded)
    batched_delete(JobEvent.objects.filter(job__cluster__cluster_id=cluster_id), unbounded)
    tally_clear("jobs", cluster_id)
