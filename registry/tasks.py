"""Thin Celery tasks for the registry."""

from celery import shared_task

from . import services
from .models import ModelVersion


@shared_task(ignore_result=True)
def registrations_poll() -> int:
    """Register completed ``register_as`` jobs (beat, every few seconds)."""
    return services.registrations_process()


@shared_task(ignore_result=True)
def version_export_run(version_id: int) -> None:
    version = ModelVersion.objects.select_related("model").filter(pk=version_id).first()
    if version is not None:
        services.version_export(version=version)
