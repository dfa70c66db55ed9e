"""The health half of the poller: agents' reports read in, controller-side checks,
and waiting repairs started."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

from clusters.choices import (
    CONTROLLER_DOWN_REASON,
    OPERATION_ACTIVE_STATES,
    NodeLifecycle,
    OperationKind,
)
from clusters.models import Cluster
from clusters.providers import get_provider

from .choices import RepairState
from .models import Repair
from .report_schema import ReportInvalid, body_parse, file_signature_valid, report_validate
from .services import agent_report_accept, failures_update, repairs_dispatch, report_time

log = logging.getLogger(__name__)
UNRESPONSIVE_STATES = ("DOWN", "NOT_RESPONDING")


def _agent_files(cluster: Cluster, provider, nodes) -> int:
    """Reports the node agents wrote (health.json in each node dir) that did not reach the
    API: the agent writes the file, then POSTs the same report, and whichever arrives
    first is stored (by the report's own time, which the API path records too). A file
    counts only when signed with the node's token and valid as the API would check it."""
    if not hasattr(provider, "node_dir"):
        return 0
    ingested = 0
    for node in nodes:
        path: Path = provider.node_dir(cluster, node.name) / "health.json"
        try:
            mtime = datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)
        except OSError:
            continue
        # The file is written after its round began: an old file is not worth reading.
        if node.last_report_time and mtime <= node.last_report_time:
            continue
        try:
            report = body_parse(path.read_bytes())
        except (OSError, ReportInvalid):
            continue
        # Only a file written with the node's token (signed by its agent), and only a report
        # the API would take: the same checks at the door.
        if not isinstance(report, dict) or not file_signature_valid(report, node.agent_token_hash):
            log.warning("%s: health.json not signed with the node's token; ignored", node.name)
            continue
        report = {k: v for k, v in report.items() if k != "signature"}
        try:
            report_validate(report, node=node.name)
        except ReportInvalid as exc:
            log.warning("%s: health.json refused: %s", node.name, exc)
            continue
        if node.last_report_time and report_time(report) <= node.last_report_time:
            continue  # delivered through the API already
        if agent_report_accept(node=node, report=report) is not None:
            ingested += 1
    return ingested


def whole_cluster_outage(cluster: Cluster) -> str:
    """Why this cluster's nodes must not be judged one by one now ("" when they may):
    its controller does not answer (one outage, which the restore handles), or an
    Operation such as that restore is bringing its daemons back."""
    if cluster.nodes.filter(slurm_reason=CONTROLLER_DOWN_REASON).exists():
        return "the controller is not answering"
    busy = cluster.operations.filter(state__in=OPERATION_ACTIVE_STATES).exclude(
        kind=OperationKind.REPAIR_NODE
    )
    if busy.exists():
        return "an operation on the cluster is running"
    return ""


def cluster_health_poll(cluster: Cluster) -> dict[str, int]:
    provider = get_provider(cluster.provider)
    nodes = list(cluster.nodes.filter(lifecycle=NodeLifecycle.ACTIVE).select_related("pool"))
    ingested = _agent_files(cluster, provider, nodes)
    if whole_cluster_outage(cluster):  # no node failures, no repairs: the restore first
        return {"ingested": ingested, "unresponsive": 0}
    dead = {n.pk for n in provider.dead_nodes(cluster, nodes)}
    if len(nodes) > 1 and len(dead) == len(nodes):
        # Every daemon gone at once is the host (or the zone), not each node: the
        # restore brings them back, before the poller has even seen them go.
        return {"ingested": ingested, "unresponsive": 0}
    in_repair = set(
        Repair.objects.filter(cluster=cluster, state=RepairState.RUNNING).values_list(
            "node_id", flat=True
        )
    )
    flagged = 0
    for node in nodes:
        if node.pk in in_repair:
            continue
        state = node.slurm_state
        if node.pk in dead:
            message = "slurmd is not running"
        elif state.startswith("DOWN") or state.endswith("*"):
            message = f"Slurm reports the node {state}"
        else:
            continue
        failures_update(
            node=node,
            source="controller",
            findings=[
                {
                    "code": "NODE_UNRESPONSIVE",
                    "severity": "critical",
                    "message": message,
                    "check": "controller",
                    "gpu": None,
                }
            ],
        )
        flagged += 1
    repairs_dispatch(cluster=cluster)
    return {"ingested": ingested, "unresponsive": flagged}
