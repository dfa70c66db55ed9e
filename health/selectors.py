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
    FloatField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
)
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.utils import timezone

from clusters.models import Cluster, Node
from jobs.choices import INTERRUPTED, JobState
from jobs.models import Job, JobEvent, JobMetric
from mtc.retention import window_within_retention

from .choices import REPAIR_ACTIVE_STATES, FailureState, RepairState
from .models import HealthReport, NodeFailure, Repair

CHART_REPORTS = 200  # the node page's charts cover this many recent reports
PAST_FAILURES = 50
NODE_REPAIRS = 50
REPAIR_HISTORY = 100
FLEET_WINDOW = timedelta(days=7)


def fleet_window() -> timedelta:
    """FLEET_WINDOW, or less when repairs or jobs are kept for less (mtc.retention): the
    fleet figures then count only rows the purge keeps, and read the same after it.
    The margin: goodput reads the repairs that started an hour before its window."""
    return window_within_retention(
        FLEET_WINDOW,
        "MTC_RETENTION_REPAIRS_DAYS",
        "MTC_RETENTION_JOBS_DAYS",
        margin=timedelta(hours=1),
    )


def fleet_window_days() -> float | int:
    """fleet_window in days, as the page says it (7, or 2.5)."""
    days = round(fleet_window().total_seconds() / 86400, 1)
    return int(days) if days == int(days) else days


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
        "cluster", "node", "failure", "requested_by", "approved_by", "operation", "spare_node"
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
def _since(window: timedelta | None):
    return timezone.now() - (window or fleet_window())


def failures_by_mode(
    cluster_id: str = "", window: timedelta | None = None
) -> list[tuple[str, int]]:
    """(mode, failures first seen within the window), most frequent first."""
    qs = NodeFailure.objects.filter(first_seen__gte=_since(window))
    if cluster_id:
        qs = qs.filter(cluster__cluster_id=cluster_id)
    return list(qs.order_by().values_list("mode").annotate(n=Count("id")).order_by("-n", "mode"))


def mean_time_to_repair(
    cluster_id: str = "", window: timedelta | None = None
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


def repairs_by_outcome(cluster_id: str = "", window: timedelta | None = None) -> dict[str, int]:
    """{state: repairs requested within the window}, every state present."""
    qs = Repair.objects.filter(create_time__gte=_since(window))
    if cluster_id:
        qs = qs.filter(cluster__cluster_id=cluster_id)
    counts = dict(qs.order_by().values_list("state").annotate(n=Count("id")))
    return {state: counts.get(state, 0) for state in RepairState.values}


# --- goodput -----------------------------------------------------------------------------


def _overlap(spans: list[tuple], start, end) -> float:
    """Seconds of ``spans`` ((start, end) pairs) that fall within [start, end]."""
    return sum(
        max(0.0, (min(b, end) - max(a, start)).total_seconds()) for a, b in spans if b > start
    )


def _running_spans(events: list[tuple], until) -> list[tuple]:
    """(start, end) of each RUNNING stretch in a job's ordered (time, state) history."""
    spans, state, since = [], "", None
    for when, new in events:
        if not new or new == state:
            continue
        if state == JobState.RUNNING:
            spans.append((since, when))
        state, since = new, when
    if state == JobState.RUNNING and until > since:
        spans.append((since, until))
    return spans


def goodput(cluster_id: str = "", window: timedelta | None = None, *, now=None) -> dict:
    """The share of the GPU time that recipe jobs held within the window which went into
    training that was kept.

    held: GPU-seconds in the RUNNING state, from each job's state history, within the window
    (a job that asked for no GPUs counts one per node). Lost, for each interruption in the
    window (a repair requeued the job): the GPU-seconds it held from the interruption to its
    first new training step (restart), and the steps since its last checkpoint times its
    mean step time and GPUs (redo). goodput = (held - lost) / held, None when nothing ran.
    Five queries, whatever the number of jobs, events or steps.
    """
    now = now or timezone.now()
    window = window or fleet_window()
    since = now - window
    jobs_qs = Job.objects.filter(recipe__gt="").filter(
        Q(end_time__isnull=True) | Q(end_time__gte=since)
    )
    if cluster_id:
        jobs_qs = jobs_qs.filter(cluster__cluster_id=cluster_id)
    ids = jobs_qs.values("id")
    jobs = {
        row["id"]: row
        for row in jobs_qs.values(
            "id", "cluster_id", "job_id", "nodes", "gpus_per_node", "state", "end_time"
        )
    }
    history: dict[int, list[tuple]] = {}
    for job_id, when, state in (
        JobEvent.objects.filter(job__in=ids).order_by("job_id", "time", "id")
    ).values_list("job_id", "time", "state"):
        history.setdefault(job_id, []).append((when, state))
    first_step = Subquery(
        JobMetric.objects.filter(job=OuterRef("job"), time__gt=OuterRef("time"))
        .order_by("time")
        .values("time")[:1]
    )
    interruptions = list(
        JobEvent.objects.filter(
            job__in=ids, cause__startswith=INTERRUPTED, time__gte=since, time__lte=now
        )
        .annotate(first_step=first_step)
        .order_by("time", "id")
        .values_list("job_id", "time", "first_step")
    )
    step_time = dict(
        JobMetric.objects.filter(job__in=ids)
        .order_by()
        .values("job")
        .annotate(s=Avg(Cast(KeyTextTransform("step_time_s", "values"), FloatField())))
        .values_list("job", "s")
    )
    repairs = Repair.objects.filter(
        start_time__gte=since - timedelta(hours=1), start_time__lte=now
    ).exclude(jobs_requeued=[])
    if cluster_id:
        repairs = repairs.filter(cluster__cluster_id=cluster_id)
    steps_lost: dict[tuple, list[tuple]] = {}  # (cluster pk, job id) -> [(repair start, steps)]
    for cluster_pk, started, requeued in repairs.order_by("start_time").values_list(
        "cluster_id", "start_time", "jobs_requeued"
    ):
        for item in requeued if isinstance(requeued, list) else []:
            if isinstance(item, dict) and item.get("job_id") is not None:
                key = (cluster_pk, str(item["job_id"]))
                steps_lost.setdefault(key, []).append((started, item.get("steps_lost")))

    def weight(job: dict) -> int:
        return (job["gpus_per_node"] or 1) * (job["nodes"] or 1)

    spans = {
        pk: _running_spans(history.get(pk, []), min(now, job["end_time"] or now))
        for pk, job in jobs.items()
    }
    held = sum(_overlap(spans[pk], since, now) * weight(job) for pk, job in jobs.items())
    restart = redo = 0.0
    unknown_steps = 0
    for pk, when, first in interruptions:
        job = jobs[pk]
        end = min(first or now, job["end_time"] or now, now)
        restart += _overlap(spans[pk], when, end) * weight(job)
        # The repair that requeued the job: the latest one that started before the event.
        earlier = [
            n for t, n in steps_lost.get((job["cluster_id"], job["job_id"]), []) if t <= when
        ]
        lost = earlier[-1] if earlier else None
        if lost and step_time.get(pk):
            redo += float(lost) * float(step_time[pk]) * weight(job)
        elif lost:
            unknown_steps += 1
    lost_total = min(held, restart + redo)
    return {
        "goodput": (held - lost_total) / held if held > 0 else None,
        "held_gpu_s": held,
        "lost_gpu_s": lost_total,
        "restart_gpu_s": restart,
        "redo_gpu_s": redo,
        "interruptions": len(interruptions),
        "interruptions_without_step_time": unknown_steps,
        "jobs": len(jobs),
        "window_s": window.total_seconds(),
    }


def node_fabric_result(node: Node, *, scan: int = 20) -> dict | None:
    """The node's part of the latest fabric check it took part in (of the cluster's last
    ``scan``): the check, its pairs with this node and their figures, and whether it was
    found bad. None when no recent check had it."""
    from .models import FabricCheck

    for check in FabricCheck.objects.filter(cluster_id=node.cluster_id)[:scan]:
        if node.name not in check.nodes:
            continue
        pairs = []
        for index, planned in enumerate(check.passes):
            for pair in planned:
                if node.name not in pair:
                    continue
                found = next(
                    (
                        r
                        for r in check.results
                        if r.get("pass") == index and sorted(r["nodes"]) == sorted(pair)
                    ),
                    None,
                )
                pairs.append(
                    {
                        "pass": index + 1,
                        "partner": next((n for n in pair if n != node.name), node.name),
                        "bus_gbps": found.get("bus_gbps") if found else None,
                        "latency_us": found.get("latency_us") if found else None,
                    }
                )
        return {"check": check, "pairs": pairs, "bad": node.name in check.bad_nodes}
    return None
