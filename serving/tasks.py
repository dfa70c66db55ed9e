"""Thin Celery tasks for serving."""

from celery import shared_task

from mtc.polls import single_flight

from .models import Endpoint
from .reconcile import endpoint_reconcile as reconcile


@shared_task(ignore_result=True)
@single_flight("serving")
def endpoints_reconcile_all() -> int:
    """Beat, every few seconds: one reconcile task per endpoint."""
    ids = list(Endpoint.objects.values_list("id", flat=True))
    for endpoint_id in ids:
        endpoint_reconcile.delay(endpoint_id)
    return len(ids)


@shared_task(ignore_result=True)
def endpoint_reconcile(endpoint_id: int) -> None:
    reconcile(endpoint_id=endpoint_id)
