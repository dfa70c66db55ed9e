"""Thin Celery tasks for jobs."""

from celery import shared_task

from clusters.choices import CLUSTER_LIVE_STATES
from clusters.models import Cluster

from .services import jobs_release_requeued
from .sync import jobs_sync


@shared_task(ignore_result=True)
def jobs_poll_all() -> int:
    """The job poller: one squeue per live cluster."""
    changed = 0
    for cluster in Cluster.objects.filter(state__in=CLUSTER_LIVE_STATES):
        stats = jobs_sync(cluster=cluster)
        changed += stats["created"] + stats["updated"] + stats["gone"]
        jobs_release_requeued(cluster=cluster)
    return changed
