"""Thin Celery tasks for health."""

from celery import shared_task

from clusters.choices import CLUSTER_LIVE_STATES
from clusters.models import Cluster

from .poll import cluster_health_poll


@shared_task(ignore_result=True)
def health_poll_all() -> int:
    flagged = 0
    for cluster in Cluster.objects.filter(state__in=CLUSTER_LIVE_STATES):
        flagged += cluster_health_poll(cluster)["unresponsive"]
    return flagged


@shared_task(ignore_result=True)
def health_reports_prune() -> int:
    from .services import reports_prune

    return reports_prune()
