"""Retention: the purge task removes finished rows and their files past their age, keeps
newer and active ones, is harmless twice, and the figures pages show still add up."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from clusters.models import Cluster, Node, NodePool, Operation
from health import selectors as health_selectors
from health.models import FabricCheck, HealthReport, NodeFailure, Repair
from jobs.models import Job, JobEvent, JobMetric
from mtc import retention
from mtc.tasks import retention_purge
from registry.models import Model, ModelVersion
from serving.models import Endpoint, EndpointEvent, EndpointRequest, Replica

from .conftest import make_spec

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)


def _cluster(cluster_id: str = "rt") -> Cluster:
    return Cluster.objects.create(
        cluster_id=cluster_id, spec=make_spec(cluster_id), state="RUNNING"
    )


def _root(cluster: Cluster) -> Path:
    return Path(settings.DATA_DIR) / "clusters" / cluster.cluster_id


_numbers = iter(range(100, 10**6))


def _job(cluster, *, state="COMPLETED", ended=None, owner=None, recipe="", **fields) -> Job:
    number = next(_numbers)
    job = Job.objects.create(
        cluster=cluster,
        job_id=str(number),
        job_number=number,
        name=f"j{number}",
        user="mtc",
        state=state,
        end_time=ended,
        owner=owner,
        recipe=recipe,
        submitted_by_mtc=True,
        **fields,
    )
    return job


def _recipe_job(cluster, *, ended, state="COMPLETED", owner=None) -> tuple[Job, Path, Path]:
    """A recipe job with its run directory and output file on disk."""
    number = next(_numbers)
    run_dir = _root(cluster) / "runs" / f"llama-pretrain-{number}"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    job = _job(
        cluster,
        state=state,
        ended=ended,
        owner=owner,
        recipe="llama-pretrain",
        checkpoint_dir=str(run_dir / "checkpoints"),
    )
    output = _root(cluster) / "output" / f"slurm-{job.job_id}.out"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("hello\n")
    JobMetric.objects.bulk_create(
        [JobMetric(job=job, step=s, values={"loss": 1.0 / s}) for s in range(1, 2501)]
    )
    JobEvent.objects.create(job=job, time=ended or timezone.now(), state=state)
    return job, run_dir, output


@pytest.fixture
def ages(settings):
    settings.MTC_RETENTION_JOBS_DAYS = 30
    settings.MTC_RETENTION_OPERATIONS_DAYS = 30
    settings.MTC_RETENTION_REPAIRS_DAYS = 30
    settings.MTC_RETENTION_HEALTH_REPORTS_DAYS = 14
    settings.MTC_RETENTION_HEALTH_REPORTS_FULL_DAYS = 1
    settings.MTC_RETENTION_ENDPOINT_REQUESTS_DAYS = 1
    settings.MTC_RETENTION_ENDPOINT_HISTORY_DAYS = 30
    settings.MTC_RETENTION_RUN_S = 60
    return settings


def test_old_finished_jobs_go_with_their_rows_and_files_newer_and_active_stay(ages, user):
    cluster = _cluster()
    now = timezone.now()
    old, old_run, old_out = _recipe_job(cluster, ended=now - 40 * DAY, owner=user)
    new, new_run, new_out = _recipe_job(cluster, ended=now - 5 * DAY, owner=user)
    # Queued for months: never purged, however old.
    running = _job(cluster, state="RUNNING", submit_time=now - 90 * DAY)
    Job.objects.filter(pk=running.pk).update(update_time=now - 90 * DAY)
    # No end time from Slurm: its last update counts.
    unknown = _job(cluster, state="UNKNOWN")
    Job.objects.filter(pk=unknown.pk).update(update_time=now - 40 * DAY)
    # A model version was registered from it: kept, with its run directory.
    registered, registered_run, _ = _recipe_job(cluster, ended=now - 40 * DAY, owner=user)
    ModelVersion.objects.create(
        model=Model.objects.create(name="m", owner=user), number=1, source_job=registered
    )

    removed = retention_purge()

    assert removed["jobs"] == 2
    assert set(Job.objects.values_list("pk", flat=True)) == {new.pk, running.pk, registered.pk}
    assert not JobMetric.objects.filter(job_id=old.pk).exists()
    assert not JobEvent.objects.filter(job_id=old.pk).exists()
    assert JobMetric.objects.filter(job=new).count() == 2500
    assert not old_run.exists() and not old_out.exists()
    assert new_run.exists() and new_out.exists() and registered_run.exists()
    assert retention.tally("jobs", cluster.cluster_id) == 2
    from health.prometheus import render

    assert 'mtc_retention_purged_total{kind="jobs",cluster="rt"} 2' in render()

    # Twice is harmless: nothing more goes, nothing is counted twice.
    assert retention_purge()["jobs"] == 0
    assert retention.tally("jobs", cluster.cluster_id) == 2


def test_a_run_stops_at_its_budget_and_the_next_goes_on(ages):
    cluster = _cluster()
    job, run_dir, _ = _recipe_job(cluster, ended=timezone.now() - 40 * DAY)
    assert retention.purge_all(budget_s=0) == {}  # spent before it began: nothing done
    assert Job.objects.filter(pk=job.pk).exists() and run_dir.exists()
    assert retention.purge_all()["jobs"] == 1
    assert not run_dir.exists()


def test_zero_days_keeps_forever(ages):
    ages.MTC_RETENTION_JOBS_DAYS = 0
    cluster = _cluster()
    job, run_dir, _ = _recipe_job(cluster, ended=timezone.now() - 4000 * DAY)
    assert "jobs" not in retention_purge()
    assert Job.objects.filter(pk=job.pk).exists() and run_dir.exists()


def test_a_path_outside_the_clusters_folder_or_through_a_link_is_never_removed(tmp_path):
    cluster_root = tmp_path / "clusters" / "c1"
    (cluster_root / "runs").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    (outside / "keep").mkdir(parents=True)
    (cluster_root / "runs" / "link").symlink_to(outside)
    assert not retention.path_remove(outside / "keep", root=cluster_root)
    assert not retention.path_remove(cluster_root / "runs" / "link" / "keep", root=cluster_root)
    assert not retention.path_remove(cluster_root / "runs" / "link", root=cluster_root)
    assert not retention.path_remove(cluster_root, root=cluster_root)
    assert not retention.path_remove(cluster_root / ".." / ".." / "elsewhere", root=cluster_root)
    assert (outside / "keep").is_dir()
    (cluster_root / "runs" / "r1").mkdir()
    assert retention.path_remove(cluster_root / "runs" / "r1", root=cluster_root)


def test_operations_finished_long_ago_go_but_active_ones_and_each_clusters_latest_stay(ages):
    cluster = _cluster()
    now = timezone.now()

    def op(state, ended, created):
        o = Operation.objects.create(
            kind="UPDATE_CLUSTER",
            target="clusters/rt",
            cluster=cluster,
            state=state,
            end_time=ended,
        )
        Operation.objects.filter(pk=o.pk).update(create_time=created)
        return o

    old = op("SUCCEEDED", now - 60 * DAY, now - 60 * DAY)
    stuck = op("RUNNING", None, now - 50 * DAY)
    latest = op("FAILED", now - 40 * DAY, now - 40 * DAY)  # explains the cluster's ERROR
    gone_cluster = Operation.objects.create(
        kind="DELETE_CLUSTER", target="clusters/x", state="SUCCEEDED", end_time=now - 60 * DAY
    )
    assert retention_purge()["operations"] == 2
    assert set(Operation.objects.values_list("pk", flat=True)) == {stuck.pk, latest.pk}
    assert not Operation.objects.filter(pk__in=[old.pk, gone_cluster.pk]).exists()
    assert retention_purge()["operations"] == 0


def _node(cluster) -> Node:
    pool = NodePool.objects.create(cluster=cluster, pool_id="gpu", machine_type="local-2")
    return Node.objects.create(cluster=cluster, pool=pool, name="rt-gpu-0", index=0)


def test_repairs_failures_and_reports_past_their_age_go_the_fleet_figures_read_the_same(ages):
    cluster = _cluster()
    node = _node(cluster)
    now = timezone.now()

    def failure(state, seen, resolved=None, mode="XID_79"):
        return NodeFailure.objects.create(
            cluster=cluster,
            node=node,
            mode=mode,
            severity="critical",
            state=state,
            first_seen=seen,
            last_seen=seen,
            resolved_time=resolved,
        )

    def repair(state, created, ended, fail=None):
        r = Repair.objects.create(
            cluster=cluster, node=node, failure=fail, action="reboot", state=state, end_time=ended
        )
        Repair.objects.filter(pk=r.pk).update(create_time=created, start_time=created)
        return r

    old_failure = failure("RESOLVED", now - 50 * DAY, now - 50 * DAY, mode="XID_48")
    old_repair = repair("SUCCEEDED", now - 50 * DAY, now - 50 * DAY, old_failure)
    open_failure = failure("OPEN", now - 60 * DAY, mode="GPU_FELL_OFF_BUS")
    waiting = repair("PENDING_APPROVAL", now - 60 * DAY, None, open_failure)
    recent_failure = failure("RESOLVED", now - 2 * DAY, now - 2 * DAY + timedelta(hours=1))
    recent = repair("SUCCEEDED", now - 2 * DAY, now - 2 * DAY + timedelta(hours=1), recent_failure)
    for days in (20, 5, 0):  # past the reports' age, in the hourly stretch, fresh
        # Two reports in one clock hour (its minutes 10 and 11, whatever minute it is now).
        hour = (now - days * DAY).replace(minute=10, second=0, microsecond=0)
        for minute in (0, 1):
            HealthReport.objects.create(node=node, time=hour + timedelta(minutes=minute))

    # Goodput's inputs: a recipe job that ran in the window, one long before it.
    for days in (45, 3):
        job = _job(cluster, ended=now - days * DAY, recipe="sft", nodes=1, gpus_per_node=8)
        JobEvent.objects.create(
            job=job, time=now - days * DAY - 2 * timedelta(hours=1), state="RUNNING"
        )
        JobEvent.objects.create(job=job, time=now - days * DAY, state="COMPLETED")

    def figures():
        return (
            health_selectors.failures_by_mode(),
            health_selectors.mean_time_to_repair(),
            health_selectors.repairs_by_outcome(),
            health_selectors.goodput(now=now),
        )

    before = figures()
    assert before[3]["held_gpu_s"] == pytest.approx(2 * 3600 * 8)
    removed = retention_purge()
    assert figures() == before  # the fleet window lies within what is kept
    assert removed["jobs"] == 1
    assert removed["repairs"] == 2  # the old repair, then its failure
    assert set(Repair.objects.values_list("pk", flat=True)) == {waiting.pk, recent.pk}
    assert set(NodeFailure.objects.values_list("pk", flat=True)) == {
        open_failure.pk,
        recent_failure.pk,
    }
    assert not Repair.objects.filter(pk=old_repair.pk).exists()
    assert HealthReport.objects.count() == 3  # the 5-day hour thinned to one, fresh ones kept
    assert retention_purge().get("repairs", 0) == 0


def test_old_fabric_checks_go_a_running_one_and_each_clusters_latest_stay(ages):
    now = timezone.now()
    first, second = _cluster("fa"), _cluster("fb")

    def check(cluster, days, state="PASSED"):
        made = FabricCheck.objects.create(cluster=cluster, trigger="on-demand", state=state)
        ended = None if state == "RUNNING" else now - days * DAY
        FabricCheck.objects.filter(pk=made.pk).update(create_time=now - days * DAY, end_time=ended)
        return made.pk

    old = [check(first, 90), check(first, 60, "FAILED")]
    running = check(first, 70, "RUNNING")
    recent = check(first, 2)
    only = check(second, 100)  # the cluster's latest, however old
    assert retention_purge()["fabric_checks"] == 2
    kept = set(FabricCheck.objects.values_list("pk", flat=True))
    assert kept == {running, recent, only} and not kept & set(old)


def test_the_fleet_window_shrinks_to_a_shorter_retention(ages, operator, client):
    ages.MTC_RETENTION_REPAIRS_DAYS = 3
    window = health_selectors.fleet_window()
    assert window == timedelta(days=3) - timedelta(hours=1)
    cluster = _cluster()
    node = _node(cluster)
    now = timezone.now()
    for days in (1, 4):  # one kept, one purged
        Repair.objects.create(
            cluster=cluster, node=node, action="reboot", state="FAILED", end_time=now - days * DAY
        )
        Repair.objects.filter(end_time=now - days * DAY).update(create_time=now - days * DAY)
    before = health_selectors.repairs_by_outcome()
    assert before["FAILED"] == 1  # the 4-day-old one is outside the shortened window
    retention_purge()
    assert health_selectors.repairs_by_outcome() == before
    client.force_login(operator)
    page = client.get(reverse("health:repairs")).content.decode()
    # The page says which window its figures cover (3 days less an hour).
    assert "last 3 days" in page and "last 7 days" not in page


def test_endpoint_requests_events_and_ended_replicas_go_a_live_endpoint_stays(ages, user):
    cluster = _cluster()
    version = ModelVersion.objects.create(
        model=Model.objects.create(name="m2", owner=user), number=1, state="READY"
    )
    endpoint = Endpoint.objects.create(
        name="e", owner=user, version=version, cluster=cluster, state="READY", replica_token="t"
    )
    now = timezone.now()
    run_dir = _root(cluster) / "serving" / f"endpoint-{endpoint.pk}" / "replica-1"
    run_dir.mkdir(parents=True)
    (run_dir / "replica.json").write_text("{}")
    Replica.objects.create(
        endpoint=endpoint, number=1, state="STOPPED", run_dir=str(run_dir), end_time=now - 40 * DAY
    )
    live = Replica.objects.create(endpoint=endpoint, number=2, state="READY", run_dir="")
    Replica.objects.filter(pk=live.pk).update(create_time=now - 90 * DAY)
    EndpointEvent.objects.create(
        endpoint=endpoint, time=now - 40 * DAY, kind="DEPLOYED", message=""
    )
    EndpointEvent.objects.create(endpoint=endpoint, time=now, kind="SCALED", message="")
    EndpointRequest.objects.bulk_create(
        [
            EndpointRequest(
                endpoint=endpoint, time=now - timedelta(days=2, seconds=i), latency_ms=1, status=200
            )
            for i in range(1500)
        ]
        + [
            EndpointRequest(
                endpoint=endpoint, time=now - timedelta(seconds=5), latency_ms=1, status=200
            )
        ]
    )
    from serving.selectors import endpoint_series

    def chart():  # what the endpoint page's chart shows, over its longest window
        return endpoint_series(endpoint, window_s=86400, now=now)

    before = chart()
    removed = retention_purge()
    assert chart() == before  # the records purged lay outside the window kept
    assert removed["endpoint_requests"] == 1500
    assert removed["endpoint_history"] == 2  # one event, one replica
    assert Endpoint.objects.filter(pk=endpoint.pk).exists()
    assert list(Replica.objects.values_list("pk", flat=True)) == [live.pk]
    assert not run_dir.exists()
    assert EndpointRequest.objects.count() == 1 and EndpointEvent.objects.count() == 1
    again = retention_purge()
    assert again["endpoint_requests"] == 0 and again["endpoint_history"] == 0


def test_the_queue_page_counts_add_up_before_and_after_the_purge(ages, operator, client):
    cluster = _cluster()
    now = timezone.now()
    for days in (40, 41, 2):
        _job(cluster, ended=now - days * DAY)
    _job(cluster, state="RUNNING")
    client.force_login(operator)
    url = reverse("jobs:queue", args=[cluster.cluster_id])

    def shown():
        context = client.get(url).context
        chips = {c["state"]: c["count"] for c in context["chips"]}
        return chips, context["page"].paginator.count, context["jobs_purged"]

    chips, total, purged = shown()
    assert chips == {"COMPLETED": 3, "RUNNING": 1} and total == 4 and purged == 0
    retention_purge()
    chips, total, purged = shown()
    # The chips count what the page lists; with the purged tally, the same jobs in all.
    assert chips == {"COMPLETED": 1, "RUNNING": 1} and total == 2
    assert total + purged == 4
    body = client.get(url).content.decode()
    assert "2 older finished jobs" in body


def test_each_purge_is_registered_with_its_setting():
    assert {p.name: p.setting for p in retention.PURGES.values()} == {
        "operations": "MTC_RETENTION_OPERATIONS_DAYS",
        "jobs": "MTC_RETENTION_JOBS_DAYS",
        "health_reports": "MTC_RETENTION_HEALTH_REPORTS_DAYS",
        "repairs": "MTC_RETENTION_REPAIRS_DAYS",
        "fabric_checks": "MTC_RETENTION_REPAIRS_DAYS",
        "endpoint_requests": "MTC_RETENTION_ENDPOINT_REQUESTS_DAYS",
        "endpoint_history": "MTC_RETENTION_ENDPOINT_HISTORY_DAYS",
        "logs": "MTC_RETENTION_LOGS_DAYS",
    }
    assert settings.CELERY_BEAT_SCHEDULE["retention-purge"]["task"] == "mtc.tasks.retention_purge"


def test_old_logs_go_and_a_big_one_keeps_its_newest_half(ages, tmp_path):
    import os
    import time

    ages.MTC_RETENTION_LOGS_DAYS = 30
    ages.MTC_RETENTION_LOG_MAX_MB = 1
    log_dir = Path(settings.DATA_DIR) / "clusters" / "lg" / "log"
    log_dir.mkdir(parents=True)
    stale = log_dir / "slurmd-lg-gpu-9.log"  # a node removed long ago
    stale.write_text("old\n")
    old = time.time() - 40 * 86400
    os.utime(stale, (old, old))
    big = log_dir / "daemons.out"
    lines = [f"line {i:07d}\n".encode() for i in range(200_000)]  # ~2.6 MB
    big.write_bytes(b"".join(lines))
    with open(big, "ab") as writer:  # a daemon holding it open for appending
        removed = retention_purge()
        writer.write(b"after the cut\n")
        writer.flush()
    assert removed["logs"] == 2
    assert not stale.exists()
    data = big.read_bytes()
    assert 0 < len(data) <= 1024 * 1024 // 2 + 100
    assert data.startswith(b"line ") and data.endswith(b"line 0199999\nafter the cut\n")
    assert retention_purge()["logs"] == 0


@pytest.mark.parametrize(
    "raw, days", [("", 90.0), ("30", 30.0), ("0.5", 0.5), ("0", 0.0), ("none", 0.0)]
)
def test_days_from_the_environment(monkeypatch, raw, days):
    from mtc.settings import _retention_days

    monkeypatch.setenv("MTC_RETENTION_X_DAYS", raw)
    assert _retention_days("MTC_RETENTION_X_DAYS", 90) == days


@pytest.mark.parametrize("raw", ["-1", "ninety", "nan"])
def test_bad_days_stop_mtc_at_start(monkeypatch, raw):
    from django.core.exceptions import ImproperlyConfigured

    from mtc.settings import _retention_days

    monkeypatch.setenv("MTC_RETENTION_X_DAYS", raw)
    with pytest.raises(ImproperlyConfigured, match="MTC_RETENTION_X_DAYS"):
        _retention_days("MTC_RETENTION_X_DAYS", 90)


def test_a_deleted_clusters_points_go_in_batches_and_its_tally_with_it(ages):
    from clusters.signals import cluster_deleting

    cluster = _cluster("gone")
    job, _, _ = _recipe_job(cluster, ended=timezone.now(), state="RUNNING")
    retention.tally_add("jobs", {"gone": 3})
    for _ in range(2):  # the delete operation may run twice
        cluster_deleting.send(sender=Cluster, cluster_id="gone")
    assert not JobMetric.objects.filter(job=job).exists()
    assert not JobEvent.objects.filter(job=job).exists()
    assert retention.tally("jobs", "gone") == 0
    assert Job.objects.filter(pk=job.pk).exists()  # the rows themselves go with the cluster


def test_the_command_purges_until_done(ages):
    from io import StringIO

    from django.core.management import call_command

    cluster = _cluster()
    for _ in range(3):
        _job(cluster, ended=timezone.now() - 40 * DAY)
    out = StringIO()
    call_command("retention_purge", "--until-done", stdout=out)
    assert "jobs: 3" in out.getvalue().splitlines()
    assert not Job.objects.exists()
