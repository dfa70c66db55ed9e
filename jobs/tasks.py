"""Thin Celery tasks for jobs."""

from celery import shared_task

from clusters.models import Cluster
from clusters.selectors import live_clusters
from mtc.polls import for_each, single_flight

from .services import jobs_release_requeued
from .sync import jobs_sync


@shared_task(ignore_result=True)
@single_flight("jobs")
def jobs_poll_all() -> int:
    """The job poller: one squeue per live cluster."""

    def poll(cluster: Cluster) -> int:
        stats = jobs_sync(cluster=cluster)
        jobs_release_requeued(cluster=cluster)
        return stats["created"] + stats["updated"] + stats["gone"]

    return for_each(live_clusters(), poll, what="job poll")
