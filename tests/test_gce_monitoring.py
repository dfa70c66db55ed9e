"""Cloud Monitoring through the real google-cloud-monitoring client (gRPC, its only
transport) against a local MetricService (tests/gce_fake.py): GPU series for the node
charts, and mtc's own figures written as custom metrics."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from clusters.models import Cluster
from clusters.providers.gce.monitoring import GPU_METRICS, CloudMonitoring
from health.cloud_metrics import cloud_metrics_export
from jobs.models import Job

from .gce_fake import FakeMonitoring
from .test_pages import make_cluster

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture
def monitoring(settings):
    with FakeMonitoring() as fake:
        settings.MTC_GCE_MONITORING_ENDPOINT = fake.endpoint
        settings.MTC_GCE_ANONYMOUS = True
        yield fake


def test_gpu_series_per_gpu_from_the_ops_agent_metrics(monitoring):
    minute = timedelta(minutes=1)
    temp, util, energy = (
        GPU_METRICS[m][0] for m in ("temperature_c", "utilization_pct", "power_w")
    )
    monitoring.add_gpu_points("c-gpu-0", temp, 0, [(NOW - 2 * minute, 61.0), (NOW - minute, 63.0)])
    monitoring.add_gpu_points("c-gpu-0", util, 0, [(NOW - minute, 0.75)])
    monitoring.add_gpu_points("c-gpu-0", util, 1, [(NOW - minute, 0.25)])
    monitoring.add_gpu_points("c-gpu-0", energy, 1, [(NOW - minute, 650.0)])
    monitoring.add_gpu_points("c-gpu-1", temp, 0, [(NOW - minute, 99.0)])  # another node

    series = CloudMonitoring("proj").gpu_series(
        "c-gpu-0", since=NOW - timedelta(hours=1), until=NOW
    )
    assert [g["index"] for g in series] == [0, 1]
    gpu0, gpu1 = series
    assert gpu0["temperature_c"] == [61.0, 63.0]
    assert gpu0["utilization_pct"] == [None, 75.0]  # a ratio, shown in percent
    assert gpu1["power_w"] == [650.0] and gpu1["utilization_pct"] == [25.0]
    # One list call per metric, filtered to the instance; power is the energy counter's rate.
    requests = {r.filter.split('"')[1]: r for r in monitoring.list_requests}
    assert set(requests) == {m[0] for m in GPU_METRICS.values()}
    assert all('metadata.system_labels.name = "c-gpu-0"' in r.filter for r in requests.values())
    assert requests[energy].aggregation.per_series_aligner.name == "ALIGN_RATE"
    assert requests[temp].aggregation.per_series_aligner.name == "ALIGN_MEAN"
    assert requests[temp].name == "projects/proj"
    # memory.bytes_used has a series per state: the chart reads "used" only.
    memory = requests[GPU_METRICS["memory_used_mib"][0]]
    assert memory.filter.endswith('AND metric.labels.state = "used"')
    assert 'state = "used"' not in requests[temp].filter


@pytest.mark.django_db
def test_export_writes_throughput_health_and_goodput(monitoring):
    cluster = make_cluster("cg", nodes=2)
    Cluster.objects.filter(pk=cluster.pk).update(provider="gce", provider_state={"project": "proj"})
    cluster.refresh_from_db()
    cluster.nodes.filter(index=0).update(health="HEALTHY")
    cluster.nodes.filter(index=1).update(health="FAILED")
    Job.objects.create(
        cluster=cluster,
        job_id="7",
        job_number=7,
        name="pre",
        user="root",
        state="RUNNING",
        recipe="llama-pretrain",
        metrics={"tokens_per_s": 1234.5},
    )
    Job.objects.create(
        cluster=cluster, job_id="8", job_number=8, name="plain", user="root", state="RUNNING"
    )

    written = cloud_metrics_export(cluster=cluster)
    (request,) = monitoring.create_requests
    assert request.name == "projects/proj"
    got = {
        (s.metric.type, tuple(sorted(s.metric.labels.items()))): s.points[0].value.double_value
        for s in request.time_series
    }
    assert written == len(got)
    assert (
        got[
            (
                "custom.googleapis.com/mtc/job/tokens_per_second",
                (("cluster", "cg"), ("job_id", "7"), ("recipe", "llama-pretrain")),
            )
        ]
        == 1234.5
    )
    healthy = {dict(k[1])["node"]: v for k, v in got.items() if k[0].endswith("node/healthy")}
    assert healthy == {"cg-gpu-0": 1.0, "cg-gpu-1": 0.0}
    assert all(s.resource.type == "global" for s in request.time_series)
    # Job counts by state, for the cluster's dashboard.
    jobs = {dict(k[1])["state"]: v for k, v in got.items() if k[0].endswith("cluster/jobs")}
    assert jobs == {"PENDING": 0.0, "RUNNING": 2.0}


@pytest.mark.django_db
def test_export_skips_a_cluster_that_never_reached_compute_engine(monitoring):
    cluster = make_cluster("cn", nodes=1)
    Cluster.objects.filter(pk=cluster.pk).update(provider="gce")
    cluster.refresh_from_db()
    assert cloud_metrics_export(cluster=cluster) == 0
    assert monitoring.create_requests == []


@pytest.mark.django_db
def test_a_gce_nodes_page_charts_its_gpus_from_cloud_monitoring(monitoring, client, operator):
    from django.core.cache import cache

    cache.clear()
    cluster = make_cluster("cp", nodes=1)
    Cluster.objects.filter(pk=cluster.pk).update(provider="gce", provider_state={"project": "proj"})
    now = datetime.now(UTC)
    monitoring.add_gpu_points(
        "cp-gpu-0", GPU_METRICS["temperature_c"][0], 3, [(now - timedelta(minutes=1), 71.5)]
    )
    client.force_login(operator)
    page = client.get("/clusters/cp/nodes/cp-gpu-0/").content.decode()
    assert "GPU metrics from Cloud Monitoring" in page
    assert '"temperature_c": [71.5]' in page and '"index": 3' in page
    # A minute's cache: the next view does not read Cloud Monitoring again.
    calls = len(monitoring.list_requests)
    client.get("/clusters/cp/nodes/cp-gpu-0/")
    assert len(monitoring.list_requests) == calls


@pytest.mark.django_db
def test_a_monitoring_outage_is_said_on_the_page(settings, client, operator):
    from django.core.cache import cache

    cache.clear()
    settings.MTC_GCE_MONITORING_ENDPOINT = "127.0.0.1:1"  # nothing listens
    settings.MTC_GCE_ANONYMOUS = True
    cluster = make_cluster("cq", nodes=1)
    Cluster.objects.filter(pk=cluster.pk).update(provider="gce", provider_state={"project": "proj"})
    client.force_login(operator)
    response = client.get("/clusters/cq/nodes/cq-gpu-0/")
    assert response.status_code == 200
    assert 'data-testid="gpu-error"' in response.content.decode()
