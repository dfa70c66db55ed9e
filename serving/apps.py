from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "serving"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from mtc.retention import purge_register

        from . import tasks  # noqa: F401 (registers the Celery tasks services enqueue by name)
        from .retention import history_purge, requests_purge

        purge_register(
            "endpoint_requests", requests_purge, setting="MTC_RETENTION_ENDPOINT_REQUESTS_DAYS"
        )
        purge_register(
            "endpoint_history", history_purge, setting="MTC_RETENTION_ENDPOINT_HISTORY_DAYS"
        )
