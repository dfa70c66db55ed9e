from django.apps import AppConfig

# The cluster page's Jobs card: the latest jobs the user may see.
RECENT_JOBS = 10


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from clusters import extensions
        from clusters.signals import cluster_deleting
        from mtc.retention import purge_register

        from . import tally, tasks  # noqa: F401 (the Celery tasks; deletions move tallies)
        from .retention import cluster_jobs_clear, jobs_purge

        purge_register("jobs", jobs_purge, setting="MTC_RETENTION_JOBS_DAYS")
        cluster_deleting.connect(cluster_jobs_clear, dispatch_uid="jobs-retention")

        if _recent_jobs not in extensions.cluster_detail_parts:
            extensions.cluster_detail_parts.append(_recent_jobs)


def _recent_jobs(request, cluster) -> dict:
    from . import selectors

    # One query.
    return {"recent_jobs": list(selectors.jobs_for_list(request.user, cluster)[:RECENT_JOBS])}
