"""Slurm's own HealthCheckProgram: slurmd runs the agent's quick checks for its node
(SLURMD_NODENAME) and a failing node drains itself, with no mtc poller involved."""

import json

import pytest

from clusters import services as cluster_services
from clusters.models import Cluster, Node
from clusters.providers import get_provider
from health.models import HealthReport
from slurm.config import HEALTH_CHECK_NODE_STATE

from .conftest import cluster_root, make_spec
from .waiting import wait_until

pytestmark = pytest.mark.slurm


def test_a_failing_health_check_drains_the_node_through_slurm(local_clusters):
    spec = make_spec("hc", nodes=2)
    # Short, so the test waits seconds (mtc's default is a minute).
    spec["orchestrator_spec"]["slurm_spec"]["config_overrides"] = {"HealthCheckInterval": 2}
    cluster_services.cluster_create(spec=spec)
    cluster = Cluster.objects.get(cluster_id="hc")
    root = cluster_root("hc")
    conf = (root / "etc" / "slurm.conf").read_text()
    wrapper = root / "etc" / "mtc-healthcheck.sh"
    assert f"HealthCheckProgram={wrapper}\n" in conf and "HealthCheckInterval=2\n" in conf
    assert f"HealthCheckNodeState={HEALTH_CHECK_NODE_STATE}\n" in conf
    provider = get_provider("local")
    client = provider.slurm(cluster)

    # slurmd ran it on start, for each node by its name: quick checks, DCGM level 1.
    for name in ("hc-gpu-0", "hc-gpu-1"):
        out = root / "nodes" / name / "healthcheck.json"
        wait_until(out.exists, what=f"a health check of {name}", timeout=20)
        report = json.loads(out.read_text())
        assert report["node"] == name
        checks = {c["name"]: c for c in report["checks"]}
        assert list(checks) == ["disk", "gpu", "ecc", "xid", "dcgm"]
        assert checks["dcgm"]["details"]["level"] == 1
        assert checks["dcgm"]["details"]["trigger"] == "healthcheck"

    # A person's drain keeps its reason; a full disk drains the other node by itself.
    client.node_update(["hc-gpu-0"], state="DRAIN", reason="maintenance")
    for name in ("hc-gpu-0", "hc-gpu-1"):
        provider.fault_inject(cluster, Node.objects.get(name=name), "disk")

    def drained():
        seen = {n.name: n for n in client.nodes()}
        return seen if "DRAIN" in seen["hc-gpu-1"].flags else None

    seen = wait_until(drained, what="hc-gpu-1 drained for its full disk", timeout=30)
    assert seen["hc-gpu-1"].reason == "mtc: DISK_FULL"
    # Wait for the round on hc-gpu-0 that saw the full disk and kept the person's drain.
    log = root / "log" / "healthcheck-hc-gpu-0.log"
    wait_until(
        lambda: log.exists() and "already drained (maintenance)" in log.read_text(),
        what=lambda: log.read_text() if log.exists() else "a health check log",
        timeout=30,
    )
    assert {n.name: n.reason for n in client.nodes()}["hc-gpu-0"] == "maintenance"
    assert not HealthReport.objects.exists()  # Slurm's mechanism alone, not mtc's poller
