"""Reads for the node-health pages: a fixed number of queries per page, whatever the
number of reports, failures or repairs."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import (
    Avg,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    OuterRef,
    QuerySet,
    Subquery,
)
from django.utils import timezone

from clusters.models import Cluster, Node

from .choices import REPAIR_ACTIVE_STATES, FailureState, RepairState
from .models import HealthReport, NodeFailure, Repair

CHART_REPORTS = 200  # the node page's charts cover this many recent reports
PAST_FAILURES = 50
NODE_REPAIRS = 50
REPAIR_HISTORY = 100
FLEET_WINDOW = timedelta(days=7)


# --- one node --------------------------------------------------------------------
def node_get(cluster_id: str, node_name: str) -> Node:
    """The node with its cluster and pool (raises Node.DoesNotExist)."""
    return Node.objects.select_related("cluster", "pool").get(
        cluster__cluster_id=cluster_id, name=node_name
    )


def node_reports(node: Node, limit: int = CHART_REPORTS) -> list[HealthReport]:
    """The node's latest reports, newest first."""
    return list(
        HealthReport.objects.filter(node=node)
        .only("id", "node_id", "time", "source", "ok", "checks", "findings")
        .order_by("-time", "-id")[:limit]
    )


def node_failures_open(node: Node) -> list[NodeFailure]:
    """Unresolved failures (at most one per mode), critical first."""
    return sorted(
        NodeFailure.objects.filter(node=node).exclude(state=FailureState.RESOLVED),
        key=lambda f: (f.severity != "critical", -f.first_seen.timestamp()),
    )


def node_failures_past(node: Node, limit: int = PAST_FAILURES) -> list[NodeFailure]:
    return list(
        NodeFailure.objects.filter(node=node, state=FailureState.RESOLVED).order_by(
            "-first_seen", "-id"
        )[:limit]
    )


def _repairs() -> QuerySet[Repair]:
    return Repair.objects.select_related(
        "cluster", "node", "failure", "requested_by", "approved_by", "operation"
    )


def node_repairs(node: Node, limit: int = NODE_REPAIRS) -> list[Repair]:
    return list(_repairs().filter(node=node).order_by("-create_time", "-id")[:limit])


# --- the repair queue -------------------------------------------------------------
def repairs_pending_count() -> int:
    """Repairs waiting for an operator's approval, on every cluster (the nav badge)."""
    return Repair.objects.filter(state=RepairState.PENDING_APPROVAL).count()


def repairs_active(cluster_id: str = "") -> list[Repair]:
    """Pending, waiting and running repairs, oldest first, each with the size of its
    node's pool (``pool_size``) for the repair budget."""
    pool_size = (
        Node.objects.filter(pool_id=OuterRef("node__pool_id"))
        .order_by()
        .values("pool_id")
        .annotate(n=Count("id"))
        .values("n")
    )
    qs = (
        _repairs()
        .select_related("node__pool")
        .filter(state__in=REPAIR_ACTIVE_STATES)
        .annotate(pool_size=Subquery(pool_size))
        .order_by("create_time", "id")
    )
    if cluster_id:
        qs = qs.filter(cluster__cluster_id=cluster_id)
    return list(qs)


def repairs_history(cluster_id: str = "", limit: int = REPAIR_HISTORY) -> list[Repair]:
    qs = _repairs().exclude(state__in=REPAIR_ACTIVE_STATES).order_by("-create_time", "-id")
    if cluster_id:
        qs = qs.filter(cluster__cluster_id=cluster_id)
    return list(qs[:limit])


def clusters_for_filter() -> list[tuple[str, str]]:
    return list(Cluster.objects.order_by("cluster_id").values_list("cluster_id", "display_name"))


# --- fleet figures (one aggregate query each) ---------------------------------------
def _since(window: timedelta):
    return timezone.now() - window


def failures_by_mode(
    cluster_id: str = "", window: timedelta = FLEET_WINDOW
) -> list[tuple[str, int]]:
    """(mode, failures first seen within the window), most frequent first."""
    qs = NodeFailure.objects.filter(first_seen__gte=_since(window))
    if cluster_id:
        qs = qs.filter(cluster__cluster_id=cluster_id)
    return list(qs.order_by().values_list("mode").annotate(n=Count("id")).order_by("-n", "mode"))


def mean_time_to_repair(
    cluster_id: str = "", window: timedelta = FLEET_WINDOW
) -> tuple[timedelta | None, int]:
    """Mean of (end of a successful repair - its failure's first sight) over the
    repairs that succeeded within the window, and how many there were."""
    qs = Repair.objects.filter(
        state=RepairState.SUCCEEDED,
        failure__isnull=False,
        end_time__isnull=False,
        end_time__gte=_since(window),
    )
    if cluster_id:
        qs = qs.filter(cluster__cluster_id=cluster_id)
    took = ExpressionWrapper(F("end_time") - F("failure__first_seen"), output_field=DurationField())
    row = qs.aggregate(mean=Avg(took, output_field=DurationField()), n=Count("id"))
    mean = row["mean"]
    if mean is not None and not isinstance(mean, timedelta):  # a backend's raw microseconds
        mean = timedelta(microseconds=float(mean))
    return mean, row["n"]


def repairs_by_outcome(cluster_id: str = "", window: timedelta = FLEET_WINDOW) -> dict[str, int]:
    """{state: repairs requested within the window}, every state present."""
    qs = Repair.objects.filter(create_time__gte=_since(window))
    if cluster_id:
        qs = qs.filter(cluster__cluster_id=cluster_id)
    counts = dict(qs.order_by().values_list("state").annotate(n=Count("id")))
    return {state: counts.get(state, 0) for state in RepairState.values}
