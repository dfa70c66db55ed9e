from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from jobs import extensions

        from . import tasks  # noqa: F401 (registers the Celery tasks services enqueue by name)

        if _registered_jobs not in extensions.job_keep_parts:
            extensions.job_keep_parts.append(_registered_jobs)


def _registered_jobs():
    """The retention purge keeps a job a version came from: the version's lineage, and
    its source checkpoint (in the job's run directory), which init_from starts from."""
    from django.db.models import Q

    return Q(model_version__isnull=False)
