"""Writes on node health: reports in, failures classified, repairs planned and
dispatched within the policy's limits.

Past 400 lines: ingest and repair planning share the failure rows and the rule of one
repair per node; split apart, each half would import the other."""

from __future__ import annotations

import logging
import math
import statistics
from datetime import UTC, datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from clusters.choices import OperationKind
from clusters.models import Cluster, Node, NodePool, Operation

from .choices import (
    REPAIR_ACTIVE_STATES,
    FailureState,
    NodeHealth,
    RepairAction,
    RepairState,
    Severity,
)
from .models import HealthReport, NodeFailure, Repair
from .policy import (
    SLOW_FRACTION,
    SLOW_ROUNDS,
    dcgm_level_for,
    mode_for,
    needs_second_signal,
    next_action,
)
from .retention import reports_prune  # noqa: F401  (its home was here)

log = logging.getLogger(__name__)


ACTION_STRENGTH = {
    RepairAction.DRAIN: 0,
    RepairAction.REBOOT: 1,
    RepairAction.REIMAGE: 2,
    RepairAction.REPLACE: 3,
}


class RepairConflict(Exception):
    """The repair cannot be requested or approved in this state (HTTP 409)."""


# --- reports -> failures ---------------------------------------------------
# How long a pool's median speed is reused before it is read again from its nodes.
MEDIAN_TTL = timedelta(seconds=10)


def _speed_of(checks: list[dict]) -> float | None:
    """GFLOP/s of the report's speed check, None when it has none."""
    mine = next((c for c in checks if isinstance(c, dict) and c.get("name") == "speed"), None)
    details = (mine or {}).get("details")
    gflops = details.get("gflops") if isinstance(details, dict) else None
    try:
        return float(gflops) if gflops else None
    except (TypeError, ValueError):
        return None


def _pool_median_speed(node: Node, *, fresh: bool = False) -> float | None:
    """The median of the latest speed figure of each node in the pool (>= 3 nodes).

    The pool keeps it for MEDIAN_TTL: reports arrive from every node every round, and
    reading the whole pool for each would make ingest grow with the pool. ``fresh``
    (or no figure kept yet) reads the nodes: one query, the figures only."""
    pool = node.pool
    now = timezone.now()
    kept = pool.speed_median_time
    if not fresh and pool.speed_median is not None and kept and now - kept < MEDIAN_TTL:
        return pool.speed_median
    speeds = list(
        Node.objects.filter(pool_id=node.pool_id, speed_gflops__isnull=False).values_list(
            "speed_gflops", flat=True
        )
    )
    median = statistics.median(speeds) if len(speeds) >= 3 else None
    NodePool.objects.filter(pk=node.pool_id).update(speed_median=median, speed_median_time=now)
    pool.speed_median, pool.speed_median_time = median, now
    return median


def _speed_findings(node: Node, gflops: float | None) -> list[dict]:
    """SLOW_NODE when this report and the SLOW_ROUNDS - 1 before it are all far below the
    pool's median. The node's own figure is stored (Node.speed_gflops) before this runs."""
    if not gflops:
        return []
    median = _pool_median_speed(node)
    if median is not None and gflops >= SLOW_FRACTION * median:
        return []  # the usual case: no query beyond the kept median
    # Slow against the kept median (or none kept): judge against the pool as it is now.
    median = _pool_median_speed(node, fresh=True)
    if not (median and gflops < SLOW_FRACTION * median):
        return []
    # One slow round can be a busy host; SLOW_NODE needs the round before too.
    earlier = list(node.health_reports.filter(source="agent").only("checks")[: SLOW_ROUNDS - 1])
    for report in earlier:
        if not (_speed_of(report.checks) or 0) < SLOW_FRACTION * median:
            return []
    if len(earlier) == SLOW_ROUNDS - 1:
        return [
            {
                "code": "SLOW_NODE",
                "severity": Severity.CRITICAL,
                "check": "speed",
                "message": f"{gflops:.2f} GFLOP/s against the pool's median "
                f"{median:.2f} (below {SLOW_FRACTION:.0%})",
            }
        ]
    return []


def report_time(report: dict) -> datetime:
    """When the report's round ran (the agent's clock), else now."""
    stamp = report.get("time")
    if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) and math.isfinite(stamp):
        return datetime.fromtimestamp(float(stamp), tz=UTC)
    return timezone.now()


def agent_report_accept(*, node: Node, report: dict) -> HealthReport | None:
    """A report the node's agent delivered: POSTed to the API, or read from the health.json
    it also writes (the poller's fallback when the API is out of reach). Stored once, by
    whichever way arrives first; a report no newer than the node's last is dropped (a
    duplicate, or a late retry that would reopen what a repair has closed since).

    One transaction, and a fixed number of queries whatever the size of the pool or the
    node's history (tests/test_fleet_queries.py holds it)."""
    when = report_time(report)
    checks = report.get("checks") if isinstance(report.get("checks"), list) else []
    gflops = _speed_of(checks)
    newer = Q(last_report_time__isnull=True) | Q(last_report_time__lt=when)
    with transaction.atomic():
        # The guard and the node's figures in one write.
        if not Node.objects.filter(newer, pk=node.pk).update(
            last_report_time=when, speed_gflops=gflops
        ):
            return None
        node.last_report_time, node.speed_gflops = when, gflops
        return report_ingest(
            node=node, report={**report, "time": when.timestamp()}, pushed=True, stamped=True
        )


def deep_check_request(*, node: Node, report: HealthReport | None = None) -> dict | None:
    """One deeper DCGM round for the node's next report, once per unresolved failure (a
    suspicion to confirm or clear); None when there is nothing new to look into (known
    without a query when ingesting ``report`` found the node with none)."""
    if report is not None and getattr(report, "nothing_unresolved", False):
        return None
    fresh = NodeFailure.objects.filter(node=node, deep_check_time__isnull=True).exclude(
        state=FailureState.RESOLVED
    )
    failures = dict(fresh.values_list("pk", "mode"))
    if not failures:
        return None
    if not NodeFailure.objects.filter(pk__in=failures, deep_check_time__isnull=True).update(
        deep_check_time=timezone.now()
    ):
        return None  # another report asked already
    return {
        "dcgm_level": dcgm_level_for("suspicion"),
        "reason": "suspicion: " + ",".join(sorted(set(failures.values()))),
    }


def report_ingest(
    *,
    node: Node,
    report: dict,
    source: str = "agent",
    pushed: bool = False,
    stamped: bool = False,
) -> HealthReport:
    """Store a report and classify its findings into failures. ``pushed``: the node's agent
    sent it (API or health.json), a claim; else mtc ran the checks itself (controller side).
    ``stamped``: the node's last_report_time and speed figure are written already."""
    checks = report.get("checks") if isinstance(report.get("checks"), list) else []
    findings = [
        {
            "code": str(f.get("code")),
            "severity": f.get("severity") or mode_for(str(f.get("code"))).severity,
            "message": str(f.get("message", ""))[:300],
            "check": c.get("name"),
            "gpu": f.get("gpu"),
        }
        for c in checks
        if isinstance(c, dict)
        for f in (c.get("findings") or [])
        if isinstance(f, dict) and f.get("code")
    ]
    when = report_time(report)
    if source == "agent":
        gflops = _speed_of(checks)
        if not stamped:
            Node.objects.filter(pk=node.pk).update(last_report_time=when, speed_gflops=gflops)
        # Judged before the row is written, so the row is written once, with the verdict.
        findings += _speed_findings(node, gflops)
    row = HealthReport.objects.create(
        node=node, time=when, source=source, ok=not findings, checks=checks, findings=findings
    )
    if stamped and not findings and node.health == NodeHealth.HEALTHY:
        # The usual round: a healthy node (no unresolved failure: its health says so, read
        # in this request) with nothing found has nothing to open, close or refresh.
        row.nothing_unresolved = True
        return row
    failures_update(node=node, findings=findings, source=source, pushed=pushed)
    return row


def _unresolved(node: Node) -> dict[str, NodeFailure]:
    """The node's unresolved failures by mode (at most one each: a constraint)."""
    return {
        f.mode: f
        for f in NodeFailure.objects.filter(node_id=node.pk).exclude(state=FailureState.RESOLVED)
    }


def _failures_open(node: Node, new: list[tuple[dict, object]], pushed: bool, now) -> list:
    """Insert the failures of newly seen modes, in one statement; when a concurrent report
    opened one of them first, each is taken one at a time (that one is then not new)."""
    rows = [
        NodeFailure(
            cluster_id=node.cluster_id,
            node_id=node.pk,
            mode=mode.code,
            severity=mode.severity,
            message=finding["message"],
            first_seen=now,
            last_seen=now,
            state=FailureState.OPEN,
            confirmed_by="" if pushed else "controller",
        )
        for finding, mode in new
    ]
    try:
        with transaction.atomic():
            return NodeFailure.objects.bulk_create(rows)
    except IntegrityError:
        pass
    created = []
    for row in rows:
        try:
            with transaction.atomic():
                row.save(force_insert=True)
        except IntegrityError:  # a concurrent report opened it
            row.pk = None
            continue
        created.append(row)
    return created


def failures_update(
    *, node: Node, findings: list[dict], source: str, pushed: bool = False
) -> list[NodeFailure]:
    """Open failures for new critical modes, refresh the ones seen again (a second sighting
    confirms a failure), and close warnings that are gone. Then plan repairs for what is
    open and has none: new failures, and those seen again after a drain held for a second
    signal. A fixed number of queries whatever the number of findings."""
    now = timezone.now()
    sighting = "repeat" if pushed else "controller"
    current = _unresolved(node)
    new: list[tuple[dict, object]] = []
    again: list[NodeFailure] = []
    seen_modes: set[str] = set()
    for finding in findings:
        mode = mode_for(finding["code"])
        if mode.code in seen_modes:
            continue  # one report is one sighting, however many GPUs show the mode
        seen_modes.add(mode.code)
        failure = current.get(mode.code)
        if failure is None:
            new.append((finding, mode))
            continue
        failure.confirmed_by = failure.confirmed_by or sighting
        failure.last_seen = now
        if mode.severity == Severity.CRITICAL and failure.state == FailureState.OPEN:
            again.append(failure)
    refreshed = [current[code] for code in seen_modes if code in current]
    if refreshed:
        NodeFailure.objects.filter(pk__in=[f.pk for f in refreshed]).update(
            last_seen=now,
            confirmed_by=Case(
                When(confirmed_by="", then=Value(sighting)), default=F("confirmed_by")
            ),
        )
    created = _failures_open(node, new, pushed, now) if new else []
    opened = [f for f in created if f.severity == Severity.CRITICAL]
    for failure in created:
        current[failure.mode] = failure
    seen = {f["code"] for f in findings}
    # The controller sees only liveness; it cannot clear warnings.
    gone = [
        f
        for f in current.values()
        if source == "agent"
        and f.state == FailureState.OPEN
        and f.severity == Severity.WARNING
        and f.mode not in seen
    ]
    if gone:
        NodeFailure.objects.filter(pk__in=[f.pk for f in gone], state=FailureState.OPEN).update(
            state=FailureState.RESOLVED, resolved_time=now
        )
        for failure in gone:
            current.pop(failure.mode, None)
    _node_health_write(node, current.values())
    due = opened + [f for f in again if next_action(f.mode, f.repair_attempts) is not None]
    if due:
        # One repair at a time per node: the one whose action reaches deepest.
        repair_plan(
            failure=max(
                due, key=lambda f: ACTION_STRENGTH.get(next_action(f.mode, f.repair_attempts), 0)
            )
        )
    return opened


def _node_health_write(node: Node, unresolved) -> None:
    """The node's health from its unresolved failures; written only when it changed."""
    states = [(f.mode, f.severity, f.state) for f in unresolved]
    if any(state == FailureState.REPAIRING for _, _, state in states):
        health = NodeHealth.REPAIRING
    elif any(sev == Severity.CRITICAL for _, sev, _ in states):
        health = NodeHealth.FAILED
    elif states:
        health = NodeHealth.WARNING
    else:
        health = NodeHealth.HEALTHY
    message = ", ".join(sorted({mode for mode, _, _ in states}))[:300]
    Node.objects.filter(pk=node.pk).exclude(health=health, health_message=message).update(
        health=health, health_message=message
    )
    node.health, node.health_message = health, message


def node_health_refresh(node: Node) -> None:
    _node_health_write(node, _unresolved(node).values())


# --- repairs ---------------------------------------------------------------
def repair_plan(
    *, failure: NodeFailure, requested_by=None, action: str | None = None
) -> Repair | None:
    """The next repair for a failure (by the policy's ladder, or the operator's choice). A
    destructive action the failure has no second signal for yet becomes a drain: the node
    leaves service, and the action waits for a repeat, a controller-side check or an
    operator (policy.needs_second_signal)."""
    action = action or next_action(failure.mode, failure.repair_attempts)
    if action is None:
        log.warning("node %s: no repair left for %s", failure.node_id, failure.mode)
        return None
    held = requested_by is None and needs_second_signal(action, failure.confirmed_by)
    message = f"{failure.mode}: {mode_for(failure.mode).meaning}"
    if held:
        message += f"; drained, {action} waits for a second signal (repeat, check, operator)"
        action = RepairAction.DRAIN
    cluster = Cluster.objects.get(pk=failure.cluster_id)
    active = Repair.objects.filter(node_id=failure.node_id, state__in=REPAIR_ACTIVE_STATES).first()
    if active is not None:  # one repair per node at a time
        if action != RepairAction.DRAIN and _held_drain_upgrade(
            active, failure, action, requested_by, message
        ):
            repairs_dispatch(cluster=cluster)
            active.refresh_from_db()
            return active
        return None
    state = (
        RepairState.PENDING_APPROVAL
        if cluster.repair_requires_approval and requested_by is None
        else RepairState.WAITING
    )
    node = Node.objects.get(pk=failure.node_id)
    with transaction.atomic():
        # The Operation exists from the start (the API answers with it); a worker gets
        # it only when the repair may run (approved, and within the pool's share).
        operation = Operation.objects.create(
            kind=OperationKind.REPAIR_NODE,
            target=f"clusters/{cluster.cluster_id}/nodes/{node.name}",
            cluster=cluster,
            owner=requested_by,
            status_message="Waiting for an operator's approval"
            if state == RepairState.PENDING_APPROVAL
            else f"{action} waiting for its turn",
        )
        repair = Repair.objects.create(
            cluster=cluster,
            node=node,
            failure=failure,
            action=action,
            state=state,
            attempt=failure.repair_attempts + 1,
            requested_by=requested_by,
            operation=operation,
            message=message[:500],
        )
        operation.params = {"repair_id": repair.pk}
        operation.save(update_fields=["params"])
    repairs_dispatch(cluster=cluster)
    repair.refresh_from_db()
    return repair


def _held_drain_upgrade(active: Repair, failure, action: str, requested_by, message: str) -> bool:
    """A drain held for a second signal that has not started becomes the repair it held."""
    if active.action != RepairAction.DRAIN or active.state == RepairState.RUNNING:
        return False
    state = RepairState.WAITING if requested_by is not None else active.state
    return bool(
        Repair.objects.filter(pk=active.pk, state=active.state, action=RepairAction.DRAIN).update(
            action=action,
            failure=failure,
            state=state,
            attempt=failure.repair_attempts + 1,
            requested_by=requested_by or active.requested_by,
            message=message[:500],
        )
    )


def repair_request(*, node: Node, action: str, requested_by) -> Repair:
    """An operator asks for a repair (POST .../repair)."""
    if action not in RepairAction.values:
        raise RepairConflict(f"Unknown action '{action}'.")
    now = timezone.now()
    failure = (
        NodeFailure.objects.filter(node=node)
        .exclude(state=FailureState.RESOLVED)
        .order_by("severity", "-first_seen")
        .first()  # "critical" sorts before "warning"
    )
    if failure is None:
        failure = NodeFailure.objects.create(
            cluster_id=node.cluster_id,
            node=node,
            mode="OPERATOR_REQUEST",
            severity=Severity.CRITICAL,
            message=f"{action} requested by {requested_by.username}",
            first_seen=now,
            last_seen=now,
        )
        # Its health says so at once: ingest takes a healthy node's health as proof that
        # it has no unresolved failure (report_ingest).
        node_health_refresh(node)
    # The operator is the second signal a destructive repair needs (policy.py).
    NodeFailure.objects.filter(pk=failure.pk, confirmed_by="").update(confirmed_by="operator")
    failure.confirmed_by = failure.confirmed_by or "operator"
    repair = repair_plan(failure=failure, requested_by=requested_by, action=action)
    if repair is None:
        raise RepairConflict(f"Node {node.name} already has a repair in progress.")
    return repair


def repair_approve(*, repair: Repair, approved_by) -> Repair:
    updated = Repair.objects.filter(pk=repair.pk, state=RepairState.PENDING_APPROVAL).update(
        state=RepairState.WAITING, approved_by=approved_by
    )
    if not updated:
        raise RepairConflict(f"Repair {repair.pk} is {repair.state}, not waiting for approval.")
    repairs_dispatch(cluster=repair.cluster)
    repair.refresh_from_db()
    return repair


def _pool_budget(node: Node, cluster: Cluster) -> int:
    size = Node.objects.filter(pool_id=node.pool_id).count()
    return max(1, math.floor(cluster.repair_max_fraction * size))


def repairs_dispatch(*, cluster: Cluster) -> list[Repair]:
    """Start WAITING repairs while each pool stays within its share in repair."""
    from clusters.services import operation_enqueue

    started = []
    for repair in (
        Repair.objects.filter(cluster=cluster, state=RepairState.WAITING)
        .select_related("node", "operation")
        .order_by("create_time", "id")
    ):
        in_repair = Repair.objects.filter(
            node__pool_id=repair.node.pool_id, state=RepairState.RUNNING
        ).count()
        if in_repair >= _pool_budget(repair.node, cluster):
            continue
        with transaction.atomic():
            if not Repair.objects.filter(pk=repair.pk, state=RepairState.WAITING).update(
                state=RepairState.RUNNING, start_time=timezone.now()
            ):
                continue  # another dispatcher took it
            if repair.failure_id:
                NodeFailure.objects.filter(pk=repair.failure_id).update(
                    state=FailureState.REPAIRING
                )
            Operation.objects.filter(pk=repair.operation_id).update(
                status_message=f"{repair.action} starting"
            )
            operation_enqueue(repair.operation)
        node_health_refresh(repair.node)
        started.append(repair)
    return started
