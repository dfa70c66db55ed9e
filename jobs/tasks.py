"""Thin Celery tasks for jobs."""

from celery import shared_task

from clusters.models import Cluster
from clusters.selectors import live_clusters
from mtc.polls import for_each, single_flight

from .services import jobs_release_requeued
from .sync import jobs_sync


def jobs_round(cluster: Cluster) -> int:
    """One poller round for a cluster's jobs: the queue synced, then the requeued jobs
    that may start released. Returns how many rows changed."""
    stats = jobs_sync(cluster=cluster)
    jobs_release_requeued(cluster=cluster)
    return stats["created"] + stats["updated"] + stats["gone"]


@shared_task(ignore_result=True)
@single_flight("jobs")
def jobs_poll_all() -> int:
    """The job poller: one squeue per live cluster."""
    return for_each(live_clusters(), jobs_round, what="job poll")
