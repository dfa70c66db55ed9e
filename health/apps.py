from django.apps import AppConfig


class HealthConfig(AppConfig):
    name = "health"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Node repair is an Operation kind this app owns: clusters runs it, health decides.
        from clusters.choices import OperationKind
        from clusters.operations import cluster_created_hooks, operation_kind_register
        from mtc.retention import purge_register

        from . import tasks  # noqa: F401 (registers the Celery tasks)
        from .fabric import fabric_check_execute, fabric_check_on_create
        from .repair import repair_execute, repair_operation_failed
        from .retention import fabric_checks_purge, repairs_purge, reports_purge

        purge_register("health_reports", reports_purge, setting="MTC_RETENTION_HEALTH_REPORTS_DAYS")
        purge_register("repairs", repairs_purge, setting="MTC_RETENTION_REPAIRS_DAYS")
        purge_register("fabric_checks", fabric_checks_purge, setting="MTC_RETENTION_REPAIRS_DAYS")

        operation_kind_register(
            OperationKind.REPAIR_NODE, repair_execute, on_fail=repair_operation_failed
        )
        # A fabric check that fails leaves its cluster as it was (no ERROR state).
        operation_kind_register(
            OperationKind.FABRIC_CHECK, fabric_check_execute, on_fail=lambda op, message: None
        )
        cluster_created_hooks.append(fabric_check_on_create)
