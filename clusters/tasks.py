"""Thin Celery tasks: look the row up by id, call a service."""

import logging

from celery import shared_task
from celery.signals import worker_ready

from mtc.polls import for_each, single_flight

from . import operations
from .selectors import live_clusters

log = logging.getLogger(__name__)


@shared_task(acks_late=True)
def operation_run(operation_id: str) -> str:
    return operations.operation_execute(operation_id=operation_id)


@shared_task(ignore_result=True)
@single_flight("nodes")
def nodes_poll_all() -> int:
    """The poller: one sinfo per live cluster; pages read what it stores."""
    return for_each(
        live_clusters(), lambda cluster: operations.nodes_sync(cluster=cluster), what="node poll"
    )


@shared_task(ignore_result=True)
@single_flight("reconcile")
def clusters_reconcile_all() -> dict:
    return {
        "resumed": operations.operations_resume(),
        "restored": operations.clusters_restore(),
    }


@worker_ready.connect
def _resume_on_start(sender=None, **kwargs):
    # A worker that starts (again) picks up what a dead one left behind.
    clusters_reconcile_all.delay()
