"""What health keeps (mtc.retention; README, "Retention").

Health reports: every one for MTC_RETENTION_HEALTH_REPORTS_FULL_DAYS (default 1), then
one per node, source and hour until MTC_RETENTION_HEALTH_REPORTS_DAYS (default 14),
then none. Finished repairs and resolved failures: MTC_RETENTION_REPAIRS_DAYS (default
180); an open failure or an active repair is never purged, however old. Finished fabric
checks: the same age, except each cluster's latest (its nodes' last fabric figures).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from mtc.retention import BATCH, Budget, batched_delete

from .choices import REPAIR_ACTIVE_STATES, FailureState
from .models import FabricCheck, HealthReport, NodeFailure, Repair


def _full_days() -> float:
    return float(getattr(settings, "MTC_RETENTION_HEALTH_REPORTS_FULL_DAYS", 1) or 0)


def reports_downsample(*, now: datetime, budget: Budget, batch: int = 50_000) -> int:
    """Within the hourly stretch, drop every report but the latest of its node, source
    and hour; ``batch`` reports are looked at a call. Returns how many went."""
    full = _full_days()
    if full <= 0:
        return 0  # every report is kept until it expires
    keep: dict[tuple, int] = {}
    drop: list[int] = []
    rows = (
        HealthReport.objects.filter(time__lt=now - timedelta(days=full))
        .order_by("-time", "-id")
        .values_list("id", "node_id", "source", "time")[:batch]
    )
    for pk, node_id, source, when in rows:
        bucket = (node_id, source, when.replace(minute=0, second=0, microsecond=0))
        if bucket in keep:
            drop.append(pk)  # a later report already stands for this hour
        else:
            keep[bucket] = pk
    deleted = 0
    for start in range(0, len(drop), BATCH):
        if budget.spent:
            break
        deleted += HealthReport.objects.filter(pk__in=drop[start : start + BATCH]).delete()[0]
    return deleted


def reports_purge(cutoff: datetime, budget: Budget) -> int:
    """Reports older than ``cutoff`` go; the hourly stretch before it is downsampled."""
    deleted = batched_delete(HealthReport.objects.filter(time__lt=cutoff), budget)
    return deleted + reports_downsample(now=timezone.now(), budget=budget)


def reports_prune(*, now=None, batch: int = 50_000) -> int:
    """Both steps at once with the configured ages (the old beat task's entry point)."""
    from mtc.retention import retention_cutoff

    now = now or timezone.now()
    budget = Budget(settings.MTC_RETENTION_RUN_S)
    cutoff = retention_cutoff("MTC_RETENTION_HEALTH_REPORTS_DAYS", now=now)
    deleted = batched_delete(HealthReport.objects.filter(time__lt=cutoff), budget) if cutoff else 0
    return deleted + reports_downsample(now=now, budget=budget, batch=batch)


def repairs_purge(cutoff: datetime, budget: Budget) -> int:
    """Finished repairs that ended (or, never started, were made) before ``cutoff``, then
    resolved failures resolved before it that no kept repair points at."""
    repairs = batched_delete(
        Repair.objects.exclude(state__in=REPAIR_ACTIVE_STATES).filter(
            Q(end_time__lt=cutoff) | Q(end_time__isnull=True, create_time__lt=cutoff)
        ),
        budget,
    )
    failures = batched_delete(
        NodeFailure.objects.filter(state=FailureState.RESOLVED)
        .filter(Q(resolved_time__lt=cutoff) | Q(resolved_time__isnull=True, last_seen__lt=cutoff))
        .filter(repairs__isnull=True),
        budget,
    )
    return repairs + failures


def fabric_checks_purge(cutoff: datetime, budget: Budget) -> int:
    """Finished fabric checks that ended (or, never ended, were made) before ``cutoff``;
    a running check and each cluster's latest stay."""
    latest = FabricCheck.objects.filter(cluster=OuterRef("cluster")).order_by("-create_time", "-id")
    return batched_delete(
        FabricCheck.objects.exclude(state=FabricCheck.State.RUNNING)
        .filter(Q(end_time__lt=cutoff) | Q(end_time__isnull=True, create_time__lt=cutoff))
        .exclude(pk=Subquery(latest.values("pk")[:1])),
        budget,
    )
