"""Thin Celery tasks for jobs."""

from celery import shared_task

from clusters.choices import CLUSTER_LIVE_STATES
from clusters.models import Cluster

from . import tensorboard
from .recipes.metrics import recipe_jobs_ingest
from .services import jobs_release_requeued
from .sync import jobs_sync


@shared_task(ignore_result=True)
def jobs_poll_all() -> int:
    """The job poller: one squeue per live cluster."""
    changed = 0
    for cluster in Cluster.objects.filter(state__in=CLUSTER_LIVE_STATES):
        stats = jobs_sync(cluster=cluster)
        changed += stats["created"] + stats["updated"] + stats["gone"]
        changed += recipe_jobs_ingest(cluster)
        jobs_release_requeued(cluster=cluster)
    return changed


@shared_task(ignore_result=True)
def tensorboards_stop_idle() -> int:
    """Stop the TensorBoards nobody looked at for MTC_TENSORBOARD_IDLE_S (and those of
    deleted clusters)."""
    return len(tensorboard.tensorboards_stop_idle(idle_s=tensorboard.idle_seconds()))
