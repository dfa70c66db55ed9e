"""The node-health pages: the node page (checks, failures, repairs, charts), the
repair queue with its fleet figures, the node tiles' health, access rules, query
counts and escaping. Rows are made directly through the models; no Slurm runs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from clusters.models import Cluster, Node, NodePool, Operation
from clusters.spec import validate_cluster_spec
from health import services
from health.models import HealthReport, NodeFailure, Repair
from mtc.templatetags.mtc_ui import health_tone, human_duration

from .conftest import CHROMIUM, CHROMIUM_ARGS, make_spec

pytestmark = pytest.mark.django_db

HOSTILE = "<script>alert('x')</script>"
HOSTILE_IMG = "<img src=x onerror=alert(1)>"


# --- fixtures and helpers ------------------------------------------------------------
@pytest.fixture
def staff_user(django_user_model):
    return django_user_model.objects.create_user("olga", password="pw-olga-123", is_staff=True)


@pytest.fixture
def plain_user(django_user_model):
    return django_user_model.objects.create_user("uma", password="pw-uma-123")


@pytest.fixture
def staff_client(staff_user):
    client = Client()
    client.force_login(staff_user)
    return client


@pytest.fixture
def plain_client(plain_user):
    client = Client()
    client.force_login(plain_user)
    return client


@pytest.fixture
def no_dispatch(monkeypatch):
    """Approved and requested repairs stay WAITING: no Operation, no Celery work."""
    monkeypatch.setattr(services, "repairs_dispatch", lambda *, cluster: [])


def make_cluster(cluster_id: str = "hp", nodes: int = 4, *, gpus: int = 8, **fields) -> Cluster:
    """A RUNNING cluster's rows alone (no daemons): a login pool and ``nodes`` idle,
    healthy GPU nodes of ``gpus`` emulated H200 each."""
    spec = validate_cluster_spec(make_spec(cluster_id, nodes=nodes))
    cluster = Cluster.objects.create(
        cluster_id=cluster_id,
        display_name=spec["display_name"],
        spec=spec,
        state="RUNNING",
        **fields,
    )
    NodePool.objects.create(cluster=cluster, pool_id="login", machine_type="local-2", is_login=True)
    pool = NodePool.objects.create(
        cluster=cluster,
        pool_id="gpu",
        machine_type="local-2",
        accelerator_type="NVIDIA_H200_141GB",
        accelerator_count=gpus,
        partitions=["gpu"],
        target_node_count=nodes,
    )
    Node.objects.bulk_create(
        Node(
            cluster=cluster,
            pool=pool,
            index=i,
            name=f"{cluster_id}-gpu-{i}",
            partition="gpu",
            slurm_state="IDLE",
            health="HEALTHY",
            gpus=gpus,
            gpu_type="h200",
            gpus_emulated=True,
            lifecycle="ACTIVE",
        )
        for i in range(nodes)
    )
    return cluster


def node_of(cluster: Cluster, index: int = 0) -> Node:
    return Node.objects.get(cluster=cluster, index=index)


def host_check(*, cpu: float = 12.5, load: float = 0.7, rx: int = 1_000_000, tx: int = 0) -> dict:
    details = {
        "cpu_util_pct": cpu,
        "cpu_count": 2,
        "load1": load,
        "mem_total_mib": 8000,
        "mem_available_mib": 6000,
        "net_rx_bytes": rx,
        "net_tx_bytes": tx,
    }
    return {
        "name": "host",
        "status": "pass",
        "duration_s": 0.2,
        "budget_s": 5,
        "details": details,
        "findings": [],
    }


def report_checks(*, gflops: float = 1.25, gpus: int = 2, temp: float = 0.0, findings=()) -> list:
    telemetry = [
        {
            "index": i,
            "bus_id": f"00000000:{i:02X}:00.0",
            "temperature_c": temp,
            "power_w": 0,
            "utilization_pct": 0,
            "memory_used_mib": 0,
        }
        for i in range(gpus)
    ]
    return [
        {
            "name": "disk",
            "status": "pass",
            "duration_s": 0.004,
            "budget_s": 10,
            "details": {"paths": {"/": {"free_gb": 120.5, "free_pct": 61.2, "total_gb": 197.0}}},
            "findings": [],
        },
        {
            "name": "gpu",
            "status": "fail" if findings else "pass",
            "duration_s": 0.21,
            "budget_s": 20,
            "details": {"expected": gpus, "count": gpus, "telemetry": telemetry},
            "findings": list(findings),
        },
        {
            "name": "speed",
            "status": "pass",
            "duration_s": 12.5,
            "budget_s": 10,
            "details": {"size": 96, "iterations": 7, "gflops": gflops},
            "findings": [],
        },
    ]


def add_report(node: Node, *, minutes_ago: float = 0, extra=(), now=None, **kwargs) -> HealthReport:
    checks = report_checks(**kwargs) + list(extra)
    findings = [{**f, "check": c["name"]} for c in checks for f in c["findings"]]
    return HealthReport.objects.create(
        node=node,
        time=(now or timezone.now()) - timedelta(minutes=minutes_ago),
        source="agent",
        ok=not findings,
        checks=checks,
        findings=findings,
    )


def add_failure(node: Node, mode: str = "GPU_ECC_UNCORRECTABLE", **fields) -> NodeFailure:
    now = timezone.now()
    values = dict(
        cluster_id=node.cluster_id,
        node=node,
        mode=mode,
        severity="critical",
        message="GPU 3 (00000000:03:00.0): 2 volatile uncorrectable ECC error(s)",
        first_seen=now - timedelta(minutes=10),
        last_seen=now,
    )
    values.update(fields)
    return NodeFailure.objects.create(**values)


def add_repair(node: Node, failure: NodeFailure | None = None, **fields) -> Repair:
    values = dict(cluster_id=node.cluster_id, node=node, failure=failure, action="reboot")
    values.setdefault("state", "SUCCEEDED")
    values.update(fields)
    return Repair.objects.create(**values)


def html(response) -> str:
    return response.content.decode()


def node_url(node: Node) -> str:
    return reverse("health:node", args=[node.cluster.cluster_id, node.name])


def _query_count(client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


# --- the node page ----------------------------------------------------------------------
def test_node_page_shows_state_checks_failures_and_repairs(staff_client, staff_user):
    cluster = make_cluster()
    node = node_of(cluster)
    Node.objects.filter(pk=node.pk).update(
        health="FAILED",
        health_message="GPU_ECC_UNCORRECTABLE",
        slurm_state="DRAINED",
        slurm_reason="mtc: GPU_ECC_UNCORRECTABLE",
        last_report_time=timezone.now(),
    )
    add_report(node, minutes_ago=5, gflops=1.5)
    add_report(
        node,
        gflops=1.4,
        findings=[
            {
                "code": "GPU_FELL_OFF_BUS",
                "severity": "critical",
                "message": "GPU 1 is unreachable",
                "gpu": 1,
            }
        ],
    )
    open_failure = add_failure(node)
    old = add_failure(
        node,
        mode="DISK_FULL",
        state="RESOLVED",
        repair_attempts=1,
        resolved_time=timezone.now() - timedelta(hours=1),
        first_seen=timezone.now() - timedelta(hours=3),
    )
    operation = Operation.objects.create(
        kind="REPAIR_NODE",
        target=f"clusters/hp/nodes/{node.name}",
        cluster=cluster,
        state="SUCCEEDED",
        progress=100,
        status_message="Done",
    )
    add_repair(
        node,
        old,
        action="reimage",
        requested_by=staff_user,
        approved_by=staff_user,
        operation=operation,
        jobs_requeued=[{"job_id": "42", "steps_lost": 17}, {"job_id": "43", "steps_lost": None}],
        start_time=timezone.now() - timedelta(hours=2),
        end_time=timezone.now() - timedelta(hours=1, minutes=58),
    )
    response = staff_client.get(node_url(node))
    assert response.status_code == 200
    page = html(response)
    # State: Slurm and health, pool, partition, emulated GPUs.
    assert 'data-testid="slurm-state" title="Slurm state">DRAINED<' in page
    assert 'data-testid="node-health" title="Health">failed<' in page
    assert "mtc: GPU_ECC_UNCORRECTABLE" in page
    assert "<strong>gpu</strong>" in page and "<code>gpu</code>" in page
    assert "8 × H200" in page and "tag-emulated" in page
    # The latest report's checks: duration against budget, details, findings.
    checks = response.context["checks"]
    assert [c["name"] for c in checks] == ["disk", "gpu", "speed"]
    speed = checks[2]
    assert speed["over_budget"] and speed["budget_pct"] == 100
    assert "1.4 GFLOP/s (96×96, 7 iterations)" in page
    assert "/: 120.5 GiB free (61.2%) of 197 GiB" in page
    assert "GPU_FELL_OFF_BUS" in page and "GPU 1 is unreachable" in page
    # Failures: open and past, with the policy's meaning.
    assert f'data-failure="{open_failure.pk}"' in page and f'data-failure="{old.pk}"' in page
    assert "volatile uncorrectable ECC errors" in page  # mode_for(...).meaning
    assert "the node&#x27;s disk is (nearly) full" in page
    assert "repair: replace" in page
    # Repairs: action, approvals, jobs with steps lost, the operation.
    assert "reimage" in page and "approved by olga" in page
    assert 'href="/clusters/hp/jobs/42/"' in page and "17 steps lost" in page
    assert "steps lost unknown" in page
    assert f"/api/v1/operations/{operation.pk}" in page
    assert "(2m 00s)" in page
    # Charts over the reports: speed per report, telemetry per GPU.
    series = response.context["series"]
    assert series["speed"]["gflops"] == [1.5, 1.4]  # oldest first
    assert [g["index"] for g in series["gpus"]] == [0, 1]
    assert series["gpus"][0]["temperature_c"] == [0.0, 0.0]
    assert 'id="node-series"' in page and 'data-node-chart="temperature_c"' in page
    assert "emulated GPUs report zeros" in page or "· emulated" in page


def test_node_page_without_reports_and_404s(staff_client):
    cluster = make_cluster()
    node = node_of(cluster)
    page = html(staff_client.get(node_url(node)))
    assert "No report yet" in page and "No failures recorded." in page
    assert "No repairs yet." in page and "No speed or GPU figures reported yet." in page
    assert 'id="node-series"' not in page
    assert staff_client.get("/clusters/hp/nodes/nope/").status_code == 404
    assert staff_client.get("/clusters/nope/nodes/hp-gpu-0/").status_code == 404


def test_node_tiles_link_to_node_pages_with_health(staff_client):
    cluster = make_cluster(nodes=3)
    Node.objects.filter(name="hp-gpu-1").update(
        health="FAILED", health_message="GPU_ECC_UNCORRECTABLE, SLOW_NODE"
    )
    Node.objects.filter(name="hp-gpu-2").update(health="UNKNOWN")
    page = html(staff_client.get(f"/clusters/{cluster.cluster_id}/"))
    # The Slurm state keeps its colour; health is an extra badge and a hover title.
    assert 'class="node-tile tone-idle" data-node="hp-gpu-1" data-state="IDLE"' in page
    assert 'data-health="FAILED"' in page
    assert 'href="/clusters/hp/nodes/hp-gpu-1/"' in page
    assert "health failed: GPU_ECC_UNCORRECTABLE, SLOW_NODE" in page
    assert 'node-health tone-bad" data-testid="node-health">failed<' in page
    assert 'node-health tone-ok" data-testid="node-health">healthy<' in page
    assert page.count('data-testid="node-health"') == 2  # UNKNOWN shows no badge


def test_non_staff_sees_no_repair_buttons_and_cannot_post(plain_client, no_dispatch):
    cluster = make_cluster()
    node = node_of(cluster)
    add_failure(node)
    page = html(plain_client.get(node_url(node)))
    assert 'data-testid="repair-form"' not in page and ">Repair</button>" not in page
    assert "Repairs</a>" not in page  # no nav entry
    url = reverse("health:node_repair", args=["hp", node.name])
    response = plain_client.post(url, {"action": "reboot"})
    assert response.status_code == 403 and "Not allowed" in html(response)
    assert not Repair.objects.exists()


def test_operator_requests_a_repair(staff_client, staff_user, no_dispatch):
    cluster = make_cluster()
    node = node_of(cluster)
    add_failure(node, mode="SLOW_NODE")
    page = html(staff_client.get(node_url(node)))
    assert 'data-testid="repair-form"' in page and "data-confirm=" in page
    # The policy's next action for SLOW_NODE (reboot) is preselected.
    assert 'value="reboot" title="restart the node (local: its slurmd)" selected' in page
    url = reverse("health:node_repair", args=["hp", node.name])
    assert staff_client.get(url).status_code == 405
    response = staff_client.post(url, {"action": "reimage"}, follow=True)
    repair = Repair.objects.get()
    assert repair.action == "reimage" and repair.requested_by == staff_user
    assert repair.state == "WAITING" and repair.failure.mode == "SLOW_NODE"
    page = html(response)
    assert "Repair requested: reimage hp-gpu-0" in page
    # A second request while one is under way is refused, and the form says why.
    assert 'disabled title="A repair of this node is already waiting"' in page
    response = staff_client.post(url, {"action": "reboot"}, follow=True)
    assert "already has a repair in progress" in html(response)
    assert Repair.objects.count() == 1
    response = staff_client.post(url, {"action": "format-c"}, follow=True)
    assert "Choose reboot, reimage or replace." in html(response)


# --- the repair queue ----------------------------------------------------------------------
def test_repair_queue_is_for_operators_only(client, plain_client, staff_client):
    assert client.get("/repairs/").status_code == 302
    response = plain_client.get("/repairs/")
    assert response.status_code == 403 and "Not allowed" in html(response)
    assert staff_client.get("/repairs/").status_code == 200


def test_repair_queue_sections_and_nav_badge(staff_client, staff_user):
    cluster = make_cluster(nodes=4, repair_requires_approval=True)
    other = make_cluster("other", nodes=2)
    nodes = list(Node.objects.filter(cluster=cluster).order_by("index"))
    pending = add_repair(nodes[0], add_failure(nodes[0]), state="PENDING_APPROVAL")
    waiting = add_repair(nodes[1], add_failure(nodes[1], mode="SLOW_NODE"), state="WAITING")
    operation = Operation.objects.create(
        kind="REPAIR_NODE",
        target="clusters/hp/nodes/hp-gpu-2",
        cluster=cluster,
        state="RUNNING",
        progress=40,
        status_message="reboot hp-gpu-2",
    )
    running = add_repair(
        nodes[2],
        add_failure(nodes[2], mode="NODE_UNRESPONSIVE"),
        state="RUNNING",
        operation=operation,
        start_time=timezone.now(),
    )
    done = add_repair(
        nodes[3],
        add_failure(nodes[3], mode="DISK_FULL", state="RESOLVED"),
        action="reimage",
        state="FAILED",
        message="checks still fail after reimage: DISK_FULL",
        end_time=timezone.now(),
    )
    elsewhere = add_repair(node_of(other), None, state="PENDING_APPROVAL")
    response = staff_client.get("/repairs/")
    page = html(response)
    assert [r.pk for r in response.context["pending"]] == [pending.pk, elsewhere.pk]
    assert [r.pk for r in response.context["waiting"]] == [waiting.pk]
    assert [r.pk for r in response.context["running"]] == [running.pk]
    assert [r.pk for r in response.context["history"]] == [done.pk]
    # Rows link to their node pages; the approve button asks first.
    assert 'href="/clusters/hp/nodes/hp-gpu-0/"' in page
    assert f'action="/repairs/{pending.pk}/approve/"' in page
    assert 'data-confirm="Approve reboot of hp-gpu-0?' in page
    # Waiting: held by the pool's budget (25% of 4 nodes = 1, one running).
    assert "<strong>1</strong> of 1 in repair" in page and "25% of 4 nodes" in page
    # Running: the operation's progress.
    assert 'aria-valuenow="40"' in page and "reboot hp-gpu-2" in page
    assert "checks still fail after reimage: DISK_FULL" in page
    # The nav shows the pending approvals.
    assert 'data-testid="nav-repairs"' in page
    assert 'title="2 waiting for approval">2</span>' in page
    # ... on every page (a context processor), not only the health app's.
    assert 'title="2 waiting for approval">2</span>' in html(staff_client.get("/clusters/"))
    # Filter by cluster.
    response = staff_client.get("/repairs/?cluster=other")
    assert [r.pk for r in response.context["pending"]] == [elsewhere.pk]
    assert not response.context["running"] and not response.context["history"]
    assert staff_client.get("/repairs/?cluster=nope").context["cluster_id"] == ""


def test_approve_moves_a_pending_repair_on(staff_client, staff_user):
    cluster = make_cluster(repair_requires_approval=True)
    node = node_of(cluster)
    # As the policy plans it: the cluster asks for approval first.
    repair = services.repair_plan(failure=add_failure(node))
    assert repair.state == "PENDING_APPROVAL"
    assert "Approve</button>" in html(staff_client.get("/repairs/"))
    response = staff_client.post(f"/repairs/{repair.pk}/approve/", {"next": "/repairs/?cluster=hp"})
    assert response.status_code == 302 and response.url == "/repairs/?cluster=hp"
    repair.refresh_from_db()
    # Dispatched within the pool's budget: it runs, with its Operation (whose work
    # starts only when the request's transaction commits, which a test never does).
    assert repair.state == "RUNNING" and repair.approved_by == staff_user
    assert repair.operation.kind == "REPAIR_NODE"
    page = html(staff_client.get("/repairs/"))
    assert f'data-repair="{repair.pk}"' in page and "Nothing waits for approval." in page
    # Approving twice is refused with a message; an outside next= is not followed.
    response = staff_client.post(
        f"/repairs/{repair.pk}/approve/", {"next": "https://evil.example/"}, follow=True
    )
    assert response.redirect_chain[-1][0] == "/repairs/"
    assert "not waiting for approval" in html(response)
    assert staff_client.post("/repairs/999999/approve/").status_code == 404


def test_non_staff_cannot_approve(plain_client, no_dispatch):
    cluster = make_cluster(repair_requires_approval=True)
    node = node_of(cluster)
    repair = add_repair(node, add_failure(node), state="PENDING_APPROVAL")
    assert plain_client.post(f"/repairs/{repair.pk}/approve/").status_code == 403
    repair.refresh_from_db()
    assert repair.state == "PENDING_APPROVAL" and repair.approved_by is None


def test_fleet_figures(staff_client):
    cluster = make_cluster(nodes=4)
    nodes = list(Node.objects.filter(cluster=cluster).order_by("index"))
    now = timezone.now()
    for node in nodes[:3]:
        add_failure(node, mode="SLOW_NODE", state="RESOLVED", first_seen=now - timedelta(hours=1))
    add_failure(nodes[3], mode="XID_79")
    add_failure(nodes[3], mode="DISK_FULL", first_seen=now - timedelta(days=9))  # too old
    # Two successful repairs: 10 and 20 minutes from first sight -> mean 15 minutes.
    for minutes, node in ((10, nodes[0]), (20, nodes[1])):
        failure = add_failure(
            node, mode="GPU_MISSING", state="RESOLVED", first_seen=now - timedelta(minutes=minutes)
        )
        add_repair(node, failure, state="SUCCEEDED", end_time=now)
    add_repair(nodes[2], None, state="FAILED", end_time=now)
    response = staff_client.get("/repairs/")
    page = html(response)
    modes = {m["mode"]: m["count"] for m in response.context["failure_modes"]}
    assert modes == {"SLOW_NODE": 3, "GPU_MISSING": 2, "XID_79": 1}
    assert response.context["failure_modes"][0]["pct"] == 100
    mttr = response.context["mttr"]
    assert abs(mttr.total_seconds() - 15 * 60) < 5
    assert "15m 00s" in page or "14m 59s" in page
    assert "over 2 successful repairs" in page
    outcomes = dict(response.context["outcomes"])
    assert outcomes["SUCCEEDED"] == 2 and outcomes["FAILED"] == 1 and outcomes["RUNNING"] == 0


def test_node_page_shows_the_dcgm_level_its_trigger_chose(staff_client):
    node = node_of(make_cluster())
    dcgm = {
        "name": "dcgm",
        "status": "pass",
        "duration_s": 0.3,
        "budget_s": 900,
        "details": {
            "level": 2,
            "trigger": "post-repair",
            "diag": {"tests": [{"name": "pcie"}, {"name": "memory"}], "failed": []},
        },
        "findings": [],
    }
    add_report(node, extra=[dcgm])
    response = staff_client.get(node_url(node))
    row = next(c for c in response.context["checks"] if c["name"] == "dcgm")
    assert row["dcgm_level"] == 2 and row["trigger"] == "post-repair"
    page = html(response)
    assert 'data-testid="dcgm-level"' in page and ">-r 2</span>" in page
    assert "diag -r 2 (post-repair): 2 tests, 0 failed" in page


def test_node_series_has_host_figures(staff_client):
    from health.metrics import node_series

    node = node_of(make_cluster())
    # 10 s apart (from one clock reading, so exactly): 1 MB then 2 MB more received;
    # then a reboot resets the counter.
    now = timezone.now()
    for i, (rx, cpu) in enumerate(((1_000_000, 10.0), (11_000_000, 30.0), (31_000_000, 50.0))):
        add_report(node, minutes_ago=1 - i / 6, now=now, extra=[host_check(rx=rx, cpu=cpu)])
    add_report(node, minutes_ago=0, now=now, extra=[host_check(rx=500, cpu=5.0)])
    reports = list(HealthReport.objects.filter(node=node).order_by("-time"))
    series = node_series(node, reports)
    host = series["host"]
    assert host["cpu_util_pct"] == [10.0, 30.0, 50.0, 5.0]  # oldest first
    assert host["net_rx_mbps"][:3] == [None, 1.0, 2.0] and host["net_rx_mbps"][3] is None
    assert host["mem_used_pct"] == [25.0] * 4 and host["load1"] == [0.7] * 4
    assert series["disk"]["paths"] == [{"path": "/", "used_pct": [38.8] * 4}]
    assert series["sources"] == {"gpu": "agent", "host": "agent"} and series["host_shared"]
    page = html(staff_client.get(node_url(node)))
    assert 'id="host-charts"' in page and 'data-host-chart="net"' in page
    assert "health/host-charts.js" in page and "shared host" in page


def _recipe_job(cluster: Cluster, job_id: str, *, gpus: int = 8, nodes: int = 2):
    from jobs.models import Job

    return Job.objects.create(
        cluster=cluster,
        job_id=job_id,
        job_number=int(job_id),
        name="llama",
        user="uma",
        state="RUNNING",
        nodes=nodes,
        gpus_per_node=gpus,
        recipe="llama-pretrain",
    )


def _interrupted_run(cluster: Cluster, job_id: str, now, *, steps_lost: int = 120) -> None:
    """Ran from -60 min, interrupted at -30 min (a repair requeued it, `steps_lost` steps
    since its checkpoint), running again at -29 min, first new step at -28 min."""
    from jobs.models import JobEvent, JobMetric

    job = _recipe_job(cluster, job_id)
    minutes = lambda m: now - timedelta(minutes=m)  # noqa: E731
    for m, state, cause in (
        (60, "RUNNING", "seen by the poller"),
        (30, "REQUEUED", "interrupted: node hp-gpu-0 NODE_UNRESPONSIVE; requeued"),
        (29.5, "PENDING", "seen by the poller"),
        (29, "RUNNING", "seen by the poller"),
    ):
        JobEvent.objects.create(job=job, time=minutes(m), state=state, cause=cause)
    JobMetric.objects.bulk_create(
        JobMetric(job=job, step=step, time=minutes(m), values={"loss": 2.0, "step_time_s": 0.5})
        for step, m in ((10, 59), (20, 45), (21, 28), (22, 27))
    )
    node = node_of(cluster)
    add_repair(
        node,
        None,
        start_time=minutes(30.1),
        end_time=minutes(29),
        jobs_requeued=[{"job_id": job_id, "steps_lost": steps_lost}],
    )


def test_goodput_counts_restart_time_and_redone_steps(staff_client):
    from health.selectors import goodput

    cluster = make_cluster()
    now = timezone.now()
    _interrupted_run(cluster, "7", now)
    figures = goodput("hp", now=now)
    # 16 GPUs held for 30 + 29 minutes; lost: 1 minute restarting (-29 to -28 running),
    # 120 steps x 0.5 s = 1 minute redone.
    assert figures["held_gpu_s"] == pytest.approx(59 * 60 * 16)
    assert figures["restart_gpu_s"] == pytest.approx(60 * 16)
    assert figures["redo_gpu_s"] == pytest.approx(60 * 16)
    assert figures["goodput"] == pytest.approx(57 / 59)
    assert figures["interruptions"] == 1 and figures["jobs"] == 1
    assert goodput("other", now=now)["goodput"] is None
    page = html(staff_client.get("/repairs/"))
    assert 'data-testid="goodput-figure">96.6%<' in page
    assert "How it is computed" in page and "lost to 1 interruption" in page


def test_goodput_queries_do_not_grow_with_jobs():
    from health.selectors import goodput

    cluster = make_cluster()
    now = timezone.now()
    _interrupted_run(cluster, "1", now)
    with CaptureQueriesContext(connection) as few:
        goodput("hp", now=now)
    for i in range(2, 12):
        _interrupted_run(cluster, str(i), now)
    with CaptureQueriesContext(connection) as many:
        figures = goodput("hp", now=now)
    assert len(many.captured_queries) == len(few.captured_queries) == 5
    assert figures["interruptions"] == 11 and figures["goodput"] == pytest.approx(57 / 59)


# --- query counts and escaping --------------------------------------------------------------
def _fill_node(node: Node, n: int, user) -> None:
    for i in range(n):
        add_report(node, minutes_ago=n - i, gflops=1.0 + i / 100, gpus=8)
    for i in range(n):
        failure = add_failure(
            node,
            mode=f"XID_{100 + i}",
            state="RESOLVED",
            first_seen=timezone.now() - timedelta(hours=i + 1),
        )
        operation = Operation.objects.create(
            kind="REPAIR_NODE", target="x", cluster=node.cluster, state="SUCCEEDED"
        )
        add_repair(
            node,
            failure,
            requested_by=user,
            approved_by=user,
            operation=operation,
            jobs_requeued=[{"job_id": str(i), "steps_lost": i}],
            end_time=timezone.now(),
        )


def test_node_page_queries_do_not_grow_with_reports_or_repairs(staff_client, staff_user):
    cluster = make_cluster(nodes=2)
    small, large = node_of(cluster, 0), node_of(cluster, 1)
    _fill_node(small, 5, staff_user)
    _fill_node(large, 50, staff_user)
    add_failure(large, mode="SLOW_NODE")
    few = _query_count(staff_client, node_url(small))
    assert _query_count(staff_client, node_url(large)) <= few


def test_repair_queue_queries_do_not_grow(staff_client, staff_user):
    def fill(cluster_id: str, n: int) -> None:
        cluster = make_cluster(cluster_id, nodes=n, repair_requires_approval=True)
        for i, node in enumerate(Node.objects.filter(cluster=cluster)):
            failure = add_failure(node, mode="SLOW_NODE")
            state = ("PENDING_APPROVAL", "WAITING", "RUNNING", "SUCCEEDED", "FAILED")[i % 5]
            operation = Operation.objects.create(
                kind="REPAIR_NODE", target="x", cluster=cluster, state="RUNNING", progress=30
            )
            add_repair(
                node,
                failure,
                state=state,
                requested_by=staff_user,
                operation=operation,
                jobs_requeued=[{"job_id": "7", "steps_lost": 1}],
                end_time=timezone.now() if state in ("SUCCEEDED", "FAILED") else None,
            )

    fill("small", 5)
    few = _query_count(staff_client, "/repairs/")
    fill("large", 50)
    assert _query_count(staff_client, "/repairs/") <= few
    assert _query_count(staff_client, "/repairs/?cluster=large") <= few


def test_user_text_is_escaped(staff_client, staff_user):
    cluster = make_cluster()
    Cluster.objects.filter(pk=cluster.pk).update(display_name=HOSTILE)
    node = node_of(cluster)
    Node.objects.filter(pk=node.pk).update(
        health="FAILED", health_message=HOSTILE_IMG, slurm_reason=HOSTILE
    )
    staff_user.username = "<b>olga</b>"
    staff_user.save()
    HealthReport.objects.create(
        node=node,
        time=timezone.now(),
        checks=[
            {
                "name": HOSTILE,
                "status": HOSTILE_IMG,
                "duration_s": "</script><script>alert(2)</script>",
                "budget_s": None,
                "details": {"reason": HOSTILE, "gflops": HOSTILE},
                "findings": [{"code": HOSTILE, "message": HOSTILE_IMG, "gpu": HOSTILE}],
            },
            {
                "name": "gpu",
                "details": {"telemetry": [{"index": 0, "temperature_c": HOSTILE}]},
            },
        ],
        findings=[{"code": HOSTILE, "message": HOSTILE_IMG, "check": HOSTILE}],
    )
    failure = add_failure(node, mode=HOSTILE, message=HOSTILE_IMG)
    add_repair(
        node,
        failure,
        state="PENDING_APPROVAL",
        message=HOSTILE,
        requested_by=staff_user,
        jobs_requeued=[{"job_id": HOSTILE, "steps_lost": HOSTILE_IMG}],
    )
    add_repair(node, failure, state="FAILED", message=HOSTILE_IMG, end_time=timezone.now())
    for url in (node_url(node), "/repairs/", "/clusters/hp/"):
        page = html(staff_client.get(url))
        assert "<script>alert" not in page and "<img src=x" not in page, url
        assert "<b>olga" not in page, url
        assert "&lt;script&gt;" in page or "&lt;img" in page, url


# --- template helpers ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "health, tone",
    [
        ("HEALTHY", "ok"),
        ("WARNING", "warn"),
        ("FAILED", "bad"),
        ("REPAIRING", "info"),
        ("UNKNOWN", "muted"),
        ("", "muted"),
    ],
)
def test_health_colours(health, tone):
    assert health_tone(health) == tone


@pytest.mark.parametrize(
    "seconds, text", [(0, "0s"), (12, "12s"), (75, "1m 15s"), (3720, "1h 02m"), (90000, "1d 1h")]
)
def test_human_duration(seconds, text):
    assert human_duration(seconds) == text


# --- in the browser ------------------------------------------------------------------------
@pytest.mark.browser
def test_node_page_and_repair_queue_in_the_browser(live_server, transactional_db, no_dispatch):
    """Charts drawn from the page's JSON, the repair form's confirmation naming the
    action, the tile link, and an approval from the repair queue (Debian's Chromium)."""
    import os
    from pathlib import Path

    if not Path("/usr/bin/chromium").exists():
        pytest.skip("Debian's chromium is not installed")
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    sync_api = pytest.importorskip("playwright.sync_api")
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_user("olga", password="pw-olga-123", is_staff=True)
    cluster = make_cluster(repair_requires_approval=True)
    node = node_of(cluster, 1)
    for i in range(6):
        add_report(
            node,
            minutes_ago=6 - i,
            gflops=1.2 - i / 50,
            gpus=4,
            extra=[host_check(cpu=10.0 + i, rx=1_000_000 * i)],
        )
    Node.objects.filter(pk=node.pk).update(health="FAILED", health_message="SLOW_NODE")
    repair = services.repair_plan(failure=add_failure(node, mode="SLOW_NODE"))
    shots = Path("/tmp/ui-shots")
    shots.mkdir(parents=True, exist_ok=True)

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 900})
            page.set_default_timeout(20_000)
            errors = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(live_server.url + "/accounts/login/")
            page.get_by_label("Username").fill("olga")
            page.get_by_label("Password").fill("pw-olga-123")
            page.get_by_role("button", name="Sign in").click()
            sync_api.expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()

            # The tile on the cluster page leads to the node page.
            page.goto(live_server.url + "/clusters/hp/")
            page.locator('[data-node="hp-gpu-1"]').click()
            sync_api.expect(page.get_by_test_id("node-health")).to_have_text("failed")
            sync_api.expect(page.locator("#node-charts")).to_have_attribute(
                "data-charts-ready", "1"
            )
            assert page.locator("#node-charts .js-plotly-plot").count() == 5
            sync_api.expect(page.locator("#host-charts")).to_have_attribute(
                "data-charts-ready", "1"
            )
            assert page.locator("#host-charts .js-plotly-plot").count() == 5
            # The repair is pending approval: the form waits.
            sync_api.expect(page.locator("#repair-action")).to_be_disabled()
            page.screenshot(path=str(shots / "health-node.png"), full_page=True)

            # Approve from the queue; the confirmation asks first.
            page.get_by_test_id("nav-repairs").click()
            sync_api.expect(page.get_by_test_id("nav-repairs")).to_contain_text("1")
            dialogs = []

            def accept(dialog):
                dialogs.append(dialog.message)
                dialog.accept()

            page.once("dialog", accept)
            page.get_by_role("button", name="Approve").click()
            sync_api.expect(page.locator(".messages")).to_contain_text("Approved: reboot hp-gpu-1")
            assert dialogs and dialogs[0].startswith("Approve reboot of hp-gpu-1?")
            page.screenshot(path=str(shots / "health-repairs.png"), full_page=True)
            repair.refresh_from_db()
            assert repair.state == "WAITING"  # repairs_dispatch is stubbed out here

            # Another node: the confirmation names the chosen action; dismissing sends nothing.
            page.goto(live_server.url + "/clusters/hp/nodes/hp-gpu-2/")
            page.locator("#repair-action").select_option("reimage")
            page.once("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.get_by_role("button", name="Repair").click()
            page.wait_for_timeout(300)
            assert dialogs[-1].startswith("Reimage hp-gpu-2?")
            assert not Repair.objects.filter(node__name="hp-gpu-2").exists()
            assert not errors, errors
        finally:
            browser.close()
