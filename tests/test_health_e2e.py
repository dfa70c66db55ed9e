"""Detect, classify, repair, resume: faults on a real 4-node local cluster."""

import time
from pathlib import Path

import pytest

from clusters import services as cluster_services
from clusters.models import Cluster, Node
from clusters.providers import get_provider
from health.models import NodeFailure, Repair
from health.poll import cluster_health_poll
from health.services import report_ingest

from .conftest import cluster_root, make_spec, sinfo_json
from .waiting import wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture
def cluster(local_clusters):
    cluster_services.cluster_create(spec=make_spec("hx", nodes=4))
    return Cluster.objects.get(cluster_id="hx")


def inject(api, node: str, kind: str, **params):
    response = api.post(
        f"/api/v1/clusters/hx/nodes/{node}/faults", {"kind": kind, **params}, format="json"
    )
    assert response.status_code == 202, response.content
    return response.json()


def check(cluster, name: str):
    """The node's agent runs once and reports (what its daemon does every few seconds)."""
    node = Node.objects.get(name=name)
    return report_ingest(node=node, report=get_provider("local").node_checks(cluster, node))


def repair_of(name: str) -> Repair:
    return Repair.objects.filter(node__name=name).select_related("failure").first()


def dcgm_run(name: str) -> tuple:
    """(level, trigger) of the DCGM diag in the node's latest report."""
    from health.models import HealthReport

    report = HealthReport.objects.filter(node__name=name).first()
    details = next(c for c in report.checks if c["name"] == "dcgm")["details"]
    return details["level"], details["trigger"]


def test_checks_pass_on_healthy_emulated_nodes(cluster):
    report = check(cluster, "hx-gpu-0")
    statuses = {c["name"]: c["status"] for c in report.checks}
    assert report.ok and statuses["gpu"] == "pass" and statuses["correctness"] == "pass"
    gpu = next(c for c in report.checks if c["name"] == "gpu")
    assert gpu["details"]["count"] == 8


def test_ecc_is_classified_and_the_node_replaced(cluster, operator_api):
    assert inject(operator_api, "hx-gpu-1", "ecc", gpu=3)["emulated"] is True
    report = check(cluster, "hx-gpu-1")
    assert "GPU_ECC_UNCORRECTABLE" in [f["code"] for f in report.findings]
    repair = repair_of("hx-gpu-1")
    assert repair.failure.mode == "GPU_ECC_UNCORRECTABLE" and repair.action == "replace"
    assert repair.state == "SUCCEEDED", repair.message
    node = Node.objects.get(name="hx-gpu-1")
    assert node.provider_id.endswith("#1") and node.health == "HEALTHY"
    assert dcgm_run("hx-gpu-1") == (3, "post-repair")  # a new machine: the long diag
    assert sinfo_json("hx")["hx-gpu-1"] == "idle"
    health = operator_api.get("/api/v1/clusters/hx/nodes/hx-gpu-1/health").json()
    assert health["failures"][0]["state"] == "RESOLVED"
    assert health["repairs"][0]["action"] == "replace"


def test_disk_full_is_found_and_reimaged(cluster, operator_api):
    inject(operator_api, "hx-gpu-2", "disk")
    fill = cluster_root("hx") / "nodes" / "hx-gpu-2" / "scratch" / "mtc-fault-fill"
    assert fill.exists()
    check(cluster, "hx-gpu-2")
    repair = repair_of("hx-gpu-2")
    assert repair.failure.mode == "DISK_FULL" and repair.action == "reimage"
    assert repair.state == "SUCCEEDED" and not fill.exists()
    assert dcgm_run("hx-gpu-2") == (2, "post-repair")


def test_dcgm_escalates_from_reimage_to_replace(cluster, operator_api):
    inject(operator_api, "hx-gpu-0", "dcgm")
    check(cluster, "hx-gpu-0")
    actions = [
        (r.action, r.state) for r in Repair.objects.filter(node__name="hx-gpu-0").order_by("id")
    ]
    assert actions == [("reimage", "FAILED"), ("replace", "SUCCEEDED")]
    assert NodeFailure.objects.get(node__name="hx-gpu-0").state == "RESOLVED"


def test_slow_node_by_the_speed_check_and_sdc_by_the_correctness_check(cluster, operator_api):
    inject(operator_api, "hx-gpu-3", "slow", duty=0.8)
    try:
        for name in ("hx-gpu-0", "hx-gpu-1", "hx-gpu-2"):
            assert check(cluster, name).ok
        assert check(cluster, "hx-gpu-3").ok  # one slow round is not enough
        slow = check(cluster, "hx-gpu-3")
        assert [f["code"] for f in slow.findings] == ["SLOW_NODE"]
        assert repair_of("hx-gpu-3").action == "reboot"
        assert repair_of("hx-gpu-3").state == "SUCCEEDED"
    finally:
        get_provider("local").fault_clear(cluster, Node.objects.get(name="hx-gpu-3"), "slow")
    inject(operator_api, "hx-gpu-1", "sdc")
    report = check(cluster, "hx-gpu-1")
    assert "SILENT_DATA_CORRUPTION" in [f["code"] for f in report.findings]
    assert repair_of("hx-gpu-1").action == "replace"


def test_with_approval_required_nothing_is_repaired_until_approved(cluster, operator_api):
    Cluster.objects.filter(pk=cluster.pk).update(repair_requires_approval=True)
    inject(operator_api, "hx-gpu-0", "disk")
    check(cluster, "hx-gpu-0")
    repair = repair_of("hx-gpu-0")
    assert repair.state == "PENDING_APPROVAL"
    fill = cluster_root("hx") / "nodes" / "hx-gpu-0" / "scratch" / "mtc-fault-fill"
    cluster_health_poll(cluster)
    assert fill.exists() and repair_of("hx-gpu-0").state == "PENDING_APPROVAL"
    op = operator_api.get(f"/api/v1/operations/{repair.operation_id}").json()
    assert op["state"] == "PENDING"
    response = operator_api.post(f"/api/v1/repairs/{repair.pk}/approve")
    assert response.status_code == 202
    assert repair_of("hx-gpu-0").state == "SUCCEEDED" and not fill.exists()
    assert operator_api.post(f"/api/v1/repairs/{repair.pk}/approve").status_code == 409


def test_no_repair_storm(cluster, operator_api, monkeypatch):
    """3 of 4 nodes faulted, at most a quarter of the pool in repair at any moment."""
    from clusters import operations
    from clusters.choices import OperationKind

    seen = []
    original = operations.HANDLERS[OperationKind.REPAIR_NODE]  # health registers it

    def watched(operation):
        seen.append(Repair.objects.filter(cluster=cluster, state="RUNNING").count())
        return original(operation)

    monkeypatch.setitem(operations.HANDLERS, OperationKind.REPAIR_NODE, watched)
    Cluster.objects.filter(pk=cluster.pk).update(repair_requires_approval=True)
    for name in ("hx-gpu-0", "hx-gpu-1", "hx-gpu-2"):
        inject(operator_api, name, "disk")
        check(cluster, name)
    pending = list(Repair.objects.filter(state="PENDING_APPROVAL"))
    assert len(pending) == 3
    Cluster.objects.filter(pk=cluster.pk).update(repair_requires_approval=False)
    from health.services import repair_approve

    for repair in pending:
        repair_approve(repair=repair, approved_by=None)
    assert max(seen) == 1 and len(seen) == 3
    assert set(Repair.objects.values_list("state", flat=True)) == {"SUCCEEDED"}


def test_operator_repair_and_errors(cluster, operator_api, user_api):
    assert (
        user_api.post(
            "/api/v1/clusters/hx/nodes/hx-gpu-0/faults", {"kind": "kill"}, format="json"
        ).status_code
        == 403
    )
    bad = operator_api.post(
        "/api/v1/clusters/hx/nodes/hx-gpu-0/faults", {"kind": "meteor"}, format="json"
    )
    assert bad.status_code == 400 and "kind" in bad.json()["error"]["fields"]
    response = operator_api.post(
        "/api/v1/clusters/hx/nodes/hx-gpu-0/repair", {"action": "reboot"}, format="json"
    )
    assert response.status_code == 202
    op = response.json()
    assert op["kind"] == "REPAIR_NODE" and op["target"] == "clusters/hx/nodes/hx-gpu-0"
    assert operator_api.get(f"/api/v1/operations/{op['id']}").json()["state"] == "SUCCEEDED"
    assert (
        operator_api.post(
            "/api/v1/clusters/hx/nodes/hx-gpu-0/repair", {"action": "x"}, format="json"
        ).status_code
        == 400
    )


def test_agent_reports_with_its_node_token(cluster, client):
    from clusters.services import node_token_issue

    node = Node.objects.get(name="hx-gpu-0")
    token = node_token_issue(node)
    report = get_provider("local").node_checks(cluster, node)
    url = "/api/v1/clusters/hx/nodes/hx-gpu-0/health/report"
    assert client.post(url, report, content_type="application/json").status_code == 401
    assert (
        client.post(
            url, report, content_type="application/json", HTTP_AUTHORIZATION="Bearer wrong"
        ).status_code
        == 401
    )
    ok = client.post(
        url, report, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert ok.status_code == 202 and ok.json()["ok"] is True


def test_killed_node_is_repaired_and_its_job_resumes(cluster, user_api, operator_api):
    from jobs.models import Job
    from jobs.sync import jobs_sync
    from recipes.metrics import recipe_jobs_ingest

    response = user_api.post(
        "/api/v1/clusters/hx/recipes/llama-pretrain/launch",
        {"nodes": 2, "overrides": {"steps": 100, "checkpoint_interval": 10}},
        format="json",
    )
    job_id = response.json()["job_id"]

    def job():
        jobs_sync(cluster=cluster)
        recipe_jobs_ingest(cluster)
        return Job.objects.get(job_id=job_id)

    wait_until(
        lambda: job().metrics.get("last_checkpoint_step", 0) >= 10,
        what="a checkpoint at step 10",
        timeout=120,
        every=0.3,
    )
    names = (
        get_provider("local")
        .slurm(cluster)
        .run(["scontrol", "show", "hostnames", job().node_list])
        .stdout.split()
    )
    victim = names[-1]
    killed_at = time.monotonic()
    response = operator_api.post(
        f"/api/v1/clusters/hx/nodes/{victim}/faults", {"kind": "kill"}, format="json"
    )
    assert response.status_code == 202 and response.json()["emulated"] is False
    flagged = cluster_health_poll(cluster)
    assert flagged["unresponsive"] == 1
    repair = repair_of(victim)
    assert repair.failure.mode == "NODE_UNRESPONSIVE" and repair.action == "reboot"
    assert repair.state == "SUCCEEDED", repair.message
    assert [j["job_id"] for j in repair.jobs_requeued] == [job_id]
    wait_until(lambda: job().state == "RUNNING", what="the job running again", timeout=60)
    running_again = time.monotonic() - killed_at
    done = wait_until(
        lambda: (j := job()).state in ("COMPLETED", "FAILED", "CANCELLED") and j,
        what=lambda: f"the job to finish; it is {job().state}",
        timeout=240,
        every=0.5,
    )
    out_dir = cluster_root("hx") / "output"
    assert done.state == "COMPLETED", "\n".join(
        p.read_text()[-4000:] for p in out_dir.glob(f"slurm-{job_id}.*")
    )
    assert done.metrics["resumed_from_step"] >= 10 and done.metrics["step"] == 100
    causes = [e.cause for e in done.events.all()]
    assert any(f"interrupted: node {victim} NODE_UNRESPONSIVE" in c for c in causes)
    assert running_again < 30
    assert Path(done.checkpoint_dir).exists()
