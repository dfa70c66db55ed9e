"""The purge of finished Operations past MTC_RETENTION_OPERATIONS_DAYS (mtc.retention).
Each cluster's latest operation stays, however old: its state and error explain the
cluster's own (an ERROR cluster points at the operation that failed)."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Exists, OuterRef, Q, QuerySet

from mtc.retention import Budget, batched_delete

from .choices import OPERATION_TERMINAL_STATES
from .models import Operation


def operations_expired(cutoff: datetime) -> QuerySet[Operation]:
    newer = Operation.objects.filter(
        cluster=OuterRef("cluster"), create_time__gt=OuterRef("create_time")
    )
    return (
        Operation.objects.filter(state__in=OPERATION_TERMINAL_STATES)
        .filter(Q(end_time__lt=cutoff) | Q(end_time__isnull=True, create_time__lt=cutoff))
        .filter(Q(cluster__isnull=True) | Exists(newer))
    )


def operations_purge(cutoff: datetime, budget: Budget) -> int:
    return batched_delete(operations_expired(cutoff), budget)
