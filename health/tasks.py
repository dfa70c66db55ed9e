"""Thin Celery tasks for health."""

import logging

from celery import shared_task

from clusters.selectors import live_clusters
from mtc.polls import for_each, single_flight

from .poll import cluster_health_poll

log = logging.getLogger(__name__)


@shared_task(ignore_result=True)
@single_flight("health")
def health_poll_all() -> int:
    return for_each(
        live_clusters(),
        lambda cluster: cluster_health_poll(cluster)["unresponsive"],
        what="health poll",
    )


@shared_task(ignore_result=True)
def health_reports_prune() -> int:
    from .retention import reports_prune

    return reports_prune()


@shared_task(ignore_result=True)
def cloud_metrics_export_all() -> int:
    """mtc's figures for every live gce cluster, to Cloud Monitoring."""
    from clusters.providers.base import ProviderError

    from .cloud_metrics import cloud_metrics_export

    written = 0
    for cluster in live_clusters().filter(provider="gce"):
        try:
            written += cloud_metrics_export(cluster=cluster)
        except ProviderError as exc:  # one project's trouble does not stop the others
            log.warning("metrics export for %s: %s", cluster.cluster_id, exc)
    return written
