"""A destructive repair (reimage, replace) needs a second signal: one agent report drains
the node and holds the repair back; a repeat of the failure in a later report, a check mtc
ran itself, or an operator lets it proceed. And /metrics holds up on odd stored data."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.models import Cluster, Node, NodePool
from clusters.services import node_token_issue
from clusters.spec import validate_cluster_spec
from health import services
from health.models import HealthReport, NodeFailure, Repair
from health.policy import needs_second_signal
from health.repair import _repair_succeeded, repair_operation_failed

from .conftest import make_spec

pytestmark = pytest.mark.django_db


def make_node(approval: bool = False) -> tuple[Node, str]:
    spec = validate_cluster_spec(make_spec("ss", nodes=1))
    cluster = Cluster.objects.create(
        cluster_id="ss",
        display_name="ss",
        spec=spec,
        state="RUNNING",
        repair_requires_approval=approval,
    )
    pool = NodePool.objects.create(cluster=cluster, pool_id="gpu", machine_type="local-2")
    node = Node.objects.create(
        cluster=cluster, pool=pool, index=0, name="ss-gpu-0", gpus=2, lifecycle="ACTIVE"
    )
    return node, node_token_issue(node)


def report(node: Node, token: str, code: str, offset: float = 0.0) -> dict:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    finding = {"code": code, "severity": "critical", "message": "m", "gpu": 0}
    body = {
        "node": node.name,
        "time": time.time() + offset,
        "agent_version": 1,
        "checks": [{"name": "ecc", "status": "fail", "findings": [finding]}],
    }
    response = api.post(f"/api/v1/clusters/ss/nodes/{node.name}/health/report", body, format="json")
    assert response.status_code == 202, response.content
    return response.json()


def actions(node: Node) -> list[tuple[str, str]]:
    return [(r.action, r.state) for r in Repair.objects.filter(node=node).order_by("id")]


def test_the_rule():
    assert needs_second_signal("replace", "") and needs_second_signal("reimage", "")
    assert not needs_second_signal("reboot", "") and not needs_second_signal("drain", "")
    for signal in ("repeat", "controller", "operator"):
        assert not needs_second_signal("replace", signal)


def test_one_report_drains_and_never_replaces():
    node, token = make_node()
    report(node, token, "GPU_ECC_UNCORRECTABLE")  # its ladder: replace
    assert actions(node) == [("drain", "RUNNING")]
    repair = Repair.objects.get(node=node)
    assert "replace waits for a second signal" in repair.message
    assert NodeFailure.objects.get(node=node).confirmed_by == ""


def test_a_repeat_in_a_later_report_lets_the_replace_proceed():
    node, token = make_node()
    report(node, token, "SILENT_DATA_CORRUPTION", offset=-20)
    _repair_succeeded(Repair.objects.get(node=node))  # the drain is done; nothing fixed
    failure = NodeFailure.objects.get(node=node)
    assert failure.state == "OPEN" and failure.repair_attempts == 0
    node.refresh_from_db()
    assert node.health == "FAILED"
    report(node, token, "SILENT_DATA_CORRUPTION")
    assert actions(node) == [("drain", "SUCCEEDED"), ("replace", "RUNNING")]
    assert NodeFailure.objects.get(node=node).confirmed_by == "repeat"


def test_a_repeat_turns_a_held_drain_that_waits_for_approval_into_the_repair():
    node, token = make_node(approval=True)
    report(node, token, "DISK_FULL", offset=-20)  # its ladder: reimage, replace
    assert actions(node) == [("drain", "PENDING_APPROVAL")]
    report(node, token, "DISK_FULL")
    assert actions(node) == [("reimage", "PENDING_APPROVAL")]  # still the operator's call


def test_an_operator_is_the_second_signal(operator):
    node, token = make_node(approval=True)
    report(node, token, "GPU_ECC_UNCORRECTABLE")
    assert actions(node) == [("drain", "PENDING_APPROVAL")]
    repair = services.repair_request(node=node, action="replace", requested_by=operator)
    assert actions(node) == [("replace", "RUNNING")] and repair.requested_by == operator
    assert NodeFailure.objects.get(node=node).confirmed_by == "operator"


def test_a_check_mtc_ran_itself_is_a_second_signal():
    node, _ = make_node()
    checks = [{"name": "disk", "status": "fail", "findings": [{"code": "DISK_FULL"}]}]
    services.report_ingest(node=node, report={"time": time.time(), "checks": checks})
    assert actions(node) == [("reimage", "RUNNING")]
    assert NodeFailure.objects.get(node=node).confirmed_by == "controller"


def test_a_single_report_may_reboot():
    node, token = make_node()
    report(node, token, "GPU_FELL_OFF_BUS")  # its ladder: reboot, replace
    assert actions(node) == [("reboot", "RUNNING")]


def test_an_escalation_without_a_second_signal_is_held_too():
    node, token = make_node()
    report(node, token, "GPU_MISSING")  # reboot first
    reboot = Repair.objects.get(node=node)
    repair_operation_failed(reboot.operation, "provider error")  # no check ran
    assert actions(node) == [("reboot", "FAILED"), ("drain", "RUNNING")]


def test_metrics_answer_on_odd_stored_data(operator_api):
    node, _ = make_node()
    odd = Node.objects.create(
        cluster=node.cluster, pool=node.pool, index=1, name="ss-gpu-ü", gpus=2
    )
    now = timezone.now()
    HealthReport.objects.create(node=odd, time=now, checks={"not": "a list"})
    HealthReport.objects.create(
        node=node,
        time=now,
        checks=[
            None,
            "gpu",
            {"name": "host"},
            {"name": "host", "details": [1, 2]},
            {"name": "speed", "details": {"gflops": "fast"}},
            {"name": "host", "details": {"load1": 10**400, "cpu_util_pct": "x", "net_rx_bytes": 5}},
            {
                "name": "gpu",
                "details": {
                    "telemetry": [
                        "gpu0",
                        {"index": 'ä\n"x', "temperature_c": 1e308, "power_w": True},
                        {"index": 1, "temperature_c": 31.5, "utilization_pct": None},
                    ]
                },
            },
        ],
    )
    NodeFailure.objects.create(
        cluster=node.cluster,
        node=odd,
        mode="ÜNICODE_☃",
        severity="critical",
        first_seen=now,
        last_seen=now,
    )
    response = operator_api.get("/metrics")
    assert response.status_code == 200
    text = response.content.decode()
    assert 'mtc_node_network_receive_bytes_total{cluster="ss",node="ss-gpu-0"} 5' in text
    assert (
        'mtc_gpu_temperature_celsius{cluster="ss",node="ss-gpu-0",gpu="1",emulated="false"} 31.5'
        in text
    )
    assert 'mode="ÜNICODE_☃"' in text
    assert "nan" not in text.lower() and "inf" not in text.lower().replace("info", "")
