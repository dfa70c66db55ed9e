"""Thin Celery tasks for what no single app owns."""

from celery import shared_task

from mtc.polls import single_flight
from mtc.retention import purge_all


@shared_task(ignore_result=True)
@single_flight("retention", ttl_s=600.0)
def retention_purge() -> dict[str, int]:
    """Every app's purge of finished rows and files past their retention (mtc.retention)."""
    return purge_all()
