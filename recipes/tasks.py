"""Thin Celery tasks for recipes."""

from celery import shared_task

from clusters.choices import CLUSTER_LIVE_STATES
from clusters.models import Cluster

from . import tensorboard
from .metrics import recipe_jobs_ingest


@shared_task(ignore_result=True)
def recipe_metrics_ingest_all() -> int:
    """Read the metrics every live cluster's recipe jobs wrote since the last round."""
    return sum(
        recipe_jobs_ingest(cluster)
        for cluster in Cluster.objects.filter(state__in=CLUSTER_LIVE_STATES)
    )


@shared_task(ignore_result=True)
def tensorboards_stop_idle() -> int:
    """Stop the TensorBoards nobody looked at for MTC_TENSORBOARD_IDLE_S (and those of
    deleted clusters)."""
    return len(tensorboard.tensorboards_stop_idle(idle_s=tensorboard.idle_seconds()))
