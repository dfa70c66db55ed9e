"""Fleet scale held as a rule: the cluster page, its node grid and the nodes API make as
many queries for 60 nodes as for 5, and an agent's report is ingested in a fixed number
of queries whatever the size of its pool or the node's history."""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from clusters.models import Cluster, Node, NodePool
from clusters.services import node_token_issue
from health.models import HealthReport, NodeFailure

from .test_health_pages import make_cluster

pytestmark = pytest.mark.django_db


def fleet(cluster_id: str, nodes: int) -> Cluster:
    """make_cluster's rows with 2-GPU nodes in each state the grid draws, in turn."""
    cluster = make_cluster(cluster_id, nodes, gpus=2)
    for offset, state in enumerate(("IDLE", "ALLOCATED", "DRAIN", "DOWN*")):
        Node.objects.filter(cluster=cluster, index__in=range(offset, nodes, 4)).update(
            slurm_state=state
        )
    return cluster


def queries(client, path: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(path)
    assert response.status_code == 200, (path, response.status_code)
    return len(ctx.captured_queries)


@pytest.mark.parametrize(
    "path",
    [
        "/clusters/{c}/",
        "/clusters/{c}/fragment/",
        "/api/v1/clusters/{c}/nodes",
        "/api/v1/clusters/{c}/nodes?page_size=500",
        "/api/v1/clusters/{c}",
    ],
)
def test_node_pages_do_not_grow_queries_with_nodes(operator, path):
    fleet("small", 5)
    fleet("large", 60)
    client = APIClient()
    client.force_login(operator)
    client.get(path.format(c="small"))  # the session and the content types, once
    few = queries(client, path.format(c="small"))
    many = queries(client, path.format(c="large"))
    assert many == few, f"{path}: {few} queries for 5 nodes, {many} for 60"


def report(node: Node, *, gflops: float = 10.0, offset: float = 0, findings=()) -> dict:
    return {
        "node": node.name,
        "time": time.time() + offset,
        "agent_version": 1,
        "checks": [
            {"name": "disk", "status": "pass", "details": {}, "findings": []},
            {
                "name": "speed",
                "status": "pass",
                "details": {"gflops": gflops},
                "findings": list(findings),
            },
        ],
    }


def post(node: Node, token: str, body: dict) -> tuple[int, int]:
    client = APIClient()
    with CaptureQueriesContext(connection) as ctx:
        response = client.post(
            f"/api/v1/clusters/{node.cluster.cluster_id}/nodes/{node.name}/health/report",
            body,
            format="json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
    assert response.status_code == 202, response.content
    return len(ctx.captured_queries), response


def test_a_report_is_ingested_in_a_fixed_number_of_queries():
    counts = {}
    for cluster_id, size in (("small", 5), ("large", 60)):
        cluster = fleet(cluster_id, size)
        nodes = list(cluster.nodes.select_related("cluster"))
        tokens = {n.pk: node_token_issue(n) for n in nodes}
        # Every node has reported before (a history to not read), speeds around 10.
        for round_ in range(3):
            for node in nodes:
                post(node, tokens[node.pk], report(node, offset=-60 + round_))
        node = nodes[-1]
        counts[cluster_id] = post(node, tokens[node.pk], report(node))[0]
    assert counts["small"] == counts["large"], counts
    assert counts["large"] <= 8, counts


def test_findings_are_written_in_a_fixed_number_of_queries():
    cluster = fleet("fx", 4)
    node_a, node_b = cluster.nodes.select_related("cluster")[:2]
    one = [{"code": "DISK_LOW", "severity": "warning", "message": "low"}]
    three = one + [
        {"code": "THERMAL_A", "severity": "warning", "message": "a"},
        {"code": "THERMAL_B", "severity": "warning", "message": "b"},
    ]
    few, _ = post(node_a, node_token_issue(node_a), report(node_a, findings=one))
    many, _ = post(node_b, node_token_issue(node_b), report(node_b, findings=three))
    assert few == many, (few, many)
    assert NodeFailure.objects.filter(node=node_b).count() == 3
    node_b.refresh_from_db()
    assert node_b.health == "WARNING" and node_b.health_message == "DISK_LOW, THERMAL_A, THERMAL_B"


def test_slow_node_is_still_judged_against_the_pool():
    cluster = fleet("sl", 4)
    nodes = list(cluster.nodes.select_related("cluster"))
    tokens = {n.pk: node_token_issue(n) for n in nodes}
    for node in nodes[:3]:
        post(node, tokens[node.pk], report(node, gflops=10.0, offset=-30))
    slow = nodes[3]
    _, first = post(slow, tokens[slow.pk], report(slow, gflops=2.0, offset=-20))
    assert first.json()["findings"] == []  # one slow round is not enough
    _, second = post(slow, tokens[slow.pk], report(slow, gflops=2.0))
    assert second.json()["findings"] == ["SLOW_NODE"]
    assert HealthReport.objects.filter(node=slow).first().ok is False
    pool = NodePool.objects.get(cluster=cluster, pool_id="gpu")
    assert pool.speed_median == pytest.approx(10.0)


def test_the_node_grid_escapes_what_nodes_report(operator):
    cluster = fleet("esc", 2)
    Node.objects.filter(cluster=cluster, index=0).update(
        health="FAILED", health_message='<b>"x"</b>', slurm_reason="<i>r</i>"
    )
    client = APIClient()
    client.force_login(operator)
    page = client.get("/clusters/esc/fragment/").content.decode()
    assert "<b>" not in page and "<i>r</i>" not in page
    assert "&lt;b&gt;&quot;x&quot;&lt;/b&gt;" in page
    assert 'href="/clusters/esc/nodes/esc-gpu-1/"' in page
