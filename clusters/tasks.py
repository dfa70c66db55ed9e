"""Thin Celery tasks: look the row up by id, call a service."""

import logging

from celery import shared_task
from celery.signals import worker_ready

from . import operations
from .choices import CLUSTER_LIVE_STATES
from .models import Cluster

log = logging.getLogger(__name__)


@shared_task(acks_late=True)
def operation_run(operation_id: str) -> str:
    return operations.operation_execute(operation_id=operation_id)


@shared_task(ignore_result=True)
def nodes_poll_all() -> int:
    """The poller: one sinfo per live cluster; pages read what it stores."""
    changed = 0
    for cluster in Cluster.objects.filter(state__in=CLUSTER_LIVE_STATES):
        changed += operations.nodes_sync(cluster=cluster)
    return changed


@shared_task(ignore_result=True)
def clusters_reconcile_all() -> dict:
    return {
        "resumed": operations.operations_resume(),
        "restored": operations.clusters_restore(),
    }


@worker_ready.connect
def _resume_on_start(sender=None, **kwargs):
    # A worker that starts (again) picks up what a dead one left behind.
    clusters_reconcile_all.delay()
