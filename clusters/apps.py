from django.apps import AppConfig


class ClustersConfig(AppConfig):
    name = "clusters"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from mtc.retention import purge_register

        from . import tasks  # noqa: F401 (registers the Celery tasks services enqueue by name)
        from .retention import operations_purge

        purge_register("operations", operations_purge, setting="MTC_RETENTION_OPERATIONS_DAYS")
