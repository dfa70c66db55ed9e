"""The node agent reporting to mtc's own API with its node's token: a real agent process
(``--once``) against a live server, the poller's health.json fallback without double
ingestion, and the server asking for a deeper DCGM round on suspicion."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.models import Cluster, Node, NodePool
from clusters.providers import get_provider
from clusters.services import node_token_issue
from clusters.spec import validate_cluster_spec
from health.models import HealthReport, NodeFailure
from health.poll import _agent_files
from node.agent import mtc_agent

from .conftest import make_spec
from .waiting import wait_until


def make_node(cluster_id: str = "ag") -> Node:
    spec = validate_cluster_spec(make_spec(cluster_id, nodes=1))
    cluster = Cluster.objects.create(
        cluster_id=cluster_id, display_name=cluster_id, spec=spec, state="RUNNING"
    )
    pool = NodePool.objects.create(
        cluster=cluster,
        pool_id="gpu",
        machine_type="local-2",
        accelerator_type="NVIDIA_H200_141GB",
        accelerator_count=2,
        partitions=["gpu"],
        target_node_count=1,
    )
    return Node.objects.create(
        cluster=cluster,
        pool=pool,
        index=0,
        name=f"{cluster_id}-gpu-0",
        gpus=2,
        gpu_type="h200",
        gpus_emulated=True,
        lifecycle="ACTIVE",
    )


def run_agent(provider, node: Node, *args: str) -> subprocess.CompletedProcess:
    node_dir = provider.node_dir(node.cluster, node.name)
    return subprocess.run(
        [sys.executable, "-S", mtc_agent.__file__, "--node", node.name]
        + ["--config", str(node_dir / "agent.json"), "--once", "--checks", "disk,host"]
        + ["--output", str(node_dir / "health.json"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def local_node(transactional_db, live_server, settings):
    settings.MTC_PUBLIC_URL = live_server.url
    node = make_node()
    provider = get_provider("local")
    provider.node_setup(node.cluster, node)  # shim, agent.json, token file
    yield provider, Node.objects.select_related("cluster").get(pk=node.pk)
    shutil.rmtree(provider.root(node.cluster), ignore_errors=True)


def test_agent_posts_to_the_api_with_its_node_token(local_node):
    provider, node = local_node
    node_dir = provider.node_dir(node.cluster, node.name)
    token_file = node_dir / "agent.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    assert node.agent_token_hash and token not in node.agent_token_hash  # only the hash
    url = provider.report_url(node.cluster, node)
    base = settings.MTC_PUBLIC_URL  # the live server's URL (the fixture)
    assert url == f"{base}/api/v1/clusters/ag/nodes/ag-gpu-0/health/report"

    proc = run_agent(provider, node, "--report-url", url, "--token-file", str(token_file))
    assert proc.returncode == 0, proc.stderr
    assert "report" not in proc.stderr  # delivered at the first try
    (report,) = HealthReport.objects.filter(node=node)
    sent = json.loads(proc.stdout)
    assert (
        [c["name"] for c in report.checks]
        == ["disk", "host"]
        == [c["name"] for c in sent["checks"]]
    )
    node.refresh_from_db()
    assert node.last_report_time == report.time
    # The same report is in health.json too: the poller does not store it again.
    assert _agent_files(node.cluster, provider, [node]) == 0
    assert HealthReport.objects.filter(node=node).count() == 1

    # A wrong token is refused and stores nothing.
    wrong = node_dir / "wrong.token"
    wrong.write_text("not-the-token\n")
    proc = run_agent(provider, node, "--report-url", url, "--token-file", str(wrong))
    assert "HTTP 401" in proc.stderr and "permanent" in proc.stderr
    assert HealthReport.objects.filter(node=node).count() == 1

    # The API out of reach: the report waits in health.json, and the poller stores it once.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/api/v1/x"
    proc = run_agent(provider, node, "--report-url", dead, "--token-file", str(token_file))
    assert "not delivered" in proc.stderr
    node.refresh_from_db()
    assert _agent_files(node.cluster, provider, [node]) == 1
    node.refresh_from_db()
    assert _agent_files(node.cluster, provider, [node]) == 0
    assert HealthReport.objects.filter(node=node).count() == 2


@pytest.mark.django_db
def test_a_late_or_repeated_report_is_not_stored_twice():
    node = make_node("dup")
    token = node_token_issue(node)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    url = "/api/v1/clusters/dup/nodes/dup-gpu-0/health/report"
    now = timezone.now().timestamp()
    report = {"node": node.name, "time": now, "agent_version": 1, "checks": []}
    first = api.post(url, report, format="json")
    assert first.status_code == 202 and first.json()["accepted"] is True
    again = api.post(url, report, format="json")
    assert again.status_code == 200 and again.json()["accepted"] is False
    older = api.post(url, {**report, "time": now - 30}, format="json")
    assert older.json()["accepted"] is False
    assert HealthReport.objects.filter(node=node).count() == 1


@pytest.mark.django_db
def test_suspicion_asks_the_agent_for_one_deeper_dcgm_round():
    node = make_node("sus")
    token = node_token_issue(node)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    url = "/api/v1/clusters/sus/nodes/sus-gpu-0/health/report"
    warning = {
        "name": "ecc",
        "status": "warn",
        "findings": [{"code": "GPU_ROW_REMAP_PENDING", "severity": "warning", "message": "m"}],
    }
    start = timezone.now() - timedelta(minutes=5)

    def post(seconds: int, checks: list) -> dict:
        body = {"node": node.name, "time": start.timestamp() + seconds, "checks": checks}
        return api.post(url, body, format="json").json()

    assert "next_round" not in post(0, [])  # nothing open
    answer = post(10, [warning])
    assert answer["next_round"] == {"dcgm_level": 2, "reason": "suspicion: GPU_ROW_REMAP_PENDING"}
    assert mtc_agent.requested_dcgm_level(answer) == (2, "suspicion: GPU_ROW_REMAP_PENDING")
    assert "next_round" not in post(20, [warning])  # once per failure
    assert NodeFailure.objects.get(node=node).deep_check_time is not None


def test_the_daemon_runs_one_deeper_round_when_asked(tmp_path):
    """--interval mode: the server's answer sets the next round's DCGM level, once."""
    from node.shim import install

    from .test_agent_report import Recorder

    node_dir = tmp_path / "n1"
    install.install(node_dir, 2, "NVIDIA_H100_80GB")
    pybin = tmp_path / "pybin"
    pybin.mkdir()
    (pybin / "python3").symlink_to(os.path.realpath(sys.executable))
    env = dict(os.environ, PATH=f"{pybin}{os.pathsep}{os.environ.get('PATH', '')}")
    answers = [{"next_round": {"dcgm_level": 3, "reason": "suspicion: XID_63"}}]
    with Recorder(answers=answers) as server:
        proc = subprocess.Popen(
            [sys.executable, "-S", mtc_agent.__file__, "--node", "n1"]
            + ["--config", str(node_dir / "agent.json"), "--interval", "0.1"]
            + ["--checks", "dcgm", "--report-url", server.url, "--token", "t"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        try:
            wait_until(
                lambda: len(server.requests) >= 3 or proc.poll() is not None,
                what="three reports",
                every=0.1,
            )
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    dcgm = [json.loads(r["body"])["checks"][0]["details"] for r in server.requests[:3]]
    assert [(d["level"], d["trigger"]) for d in dcgm] == [
        (1, "periodic"),
        (3, "requested: suspicion: XID_63"),
        (1, "periodic"),
    ]
    assert dcgm[1]["diag"]["tests"] and dcgm[1]["diag"] != dcgm[0]["diag"]
