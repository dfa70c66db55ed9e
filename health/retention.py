"""Health reports kept: all for a day, hourly for two weeks, then none."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from .models import HealthReport

REPORTS_FULL_DAYS = 1  # every report kept this long
REPORTS_HOURLY_DAYS = 14  # then one report per node and hour, then none


def reports_prune(*, now=None, batch: int = 50_000) -> int:
    """Downsample old health reports: all for a day, hourly for two weeks, then gone.
    Returns how many were deleted."""
    now = now or timezone.now()
    deleted, _ = HealthReport.objects.filter(
        time__lt=now - timedelta(days=REPORTS_HOURLY_DAYS)
    ).delete()
    keep: dict[tuple, int] = {}
    drop: list[int] = []
    rows = (
        HealthReport.objects.filter(time__lt=now - timedelta(days=REPORTS_FULL_DAYS))
        .order_by("-time", "-id")
        .values_list("id", "node_id", "source", "time")[:batch]
    )
    for pk, node_id, source, when in rows:
        bucket = (node_id, source, when.replace(minute=0, second=0, microsecond=0))
        if bucket in keep:
            drop.append(pk)  # a later report already stands for this hour
        else:
            keep[bucket] = pk
    for start in range(0, len(drop), 900):
        HealthReport.objects.filter(pk__in=drop[start : start + 900]).delete()
    return deleted + len(drop)
