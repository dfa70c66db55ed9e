"""GET /metrics in Prometheus' text format."""

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.models import Cluster, Node, NodePool
from clusters.spec import validate_cluster_spec
from health.models import HealthReport

from .conftest import make_spec

pytestmark = pytest.mark.django_db


def _cluster_with_reports(n_nodes: int) -> Cluster:
    cluster = Cluster.objects.create(
        cluster_id=f"pm{n_nodes}",
        state="RUNNING",
        spec=validate_cluster_spec(make_spec(f"pm{n_nodes}")),
    )
    pool = NodePool.objects.create(cluster=cluster, pool_id="gpu", machine_type="local-2")
    for i in range(n_nodes):
        node = Node.objects.create(
            cluster=cluster,
            pool=pool,
            index=i,
            name=f"pm-{n_nodes}-{i}",
            slurm_state="IDLE",
            health="HEALTHY",
            gpus=2,
            gpus_emulated=True,
        )
        HealthReport.objects.create(
            node=node,
            time=timezone.now(),
            checks=[
                {"name": "speed", "details": {"gflops": 1.5}},
                {
                    "name": "host",
                    "details": {
                        "cpu_util_pct": 25.0,
                        "load1": 0.5,
                        "mem_available_mib": 1024,
                        "net_rx_bytes": 10,
                        "net_tx_bytes": 20,
                    },
                },
                {
                    "name": "gpu",
                    "details": {
                        "telemetry": [
                            {
                                "index": g,
                                "temperature_c": 30,
                                "power_w": 0,
                                "utilization_pct": 0,
                                "memory_used_mib": 1,
                                "ecc_uncorrected_volatile": 0,
                            }
                            for g in range(2)
                        ]
                    },
                },
            ],
        )
    return cluster


def test_needs_a_token_and_reports_the_fleet(operator_api, django_assert_max_num_queries):
    _cluster_with_reports(2)
    assert APIClient().get("/metrics").status_code == 401
    response = operator_api.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    text = response.content.decode()
    assert 'mtc_cluster_info{cluster="pm2",provider="local",state="RUNNING"} 1' in text
    assert 'mtc_nodes{cluster="pm2",slurm_state="IDLE",health="HEALTHY"} 2' in text
    assert 'mtc_node_speed_gflops{cluster="pm2",node="pm-2-1"} 1.5' in text
    assert (
        'mtc_gpu_memory_used_bytes{cluster="pm2",node="pm-2-0",gpu="1",emulated="true"} 1.04858e+06'
    ) in text
    assert "# TYPE mtc_gpu_temperature_celsius gauge" in text
    assert 'mtc_node_cpu_utilization_ratio{cluster="pm2",node="pm-2-0"} 0.25' in text
    assert "# TYPE mtc_node_network_receive_bytes_total counter" in text


def test_query_count_does_not_grow_with_nodes(operator_api, django_assert_max_num_queries):
    _cluster_with_reports(3)
    with django_assert_max_num_queries(10) as few:
        operator_api.get("/metrics")
    _cluster_with_reports(30)
    with django_assert_max_num_queries(len(few.captured_queries)):
        operator_api.get("/metrics")


def test_old_reports_are_downsampled_then_dropped():
    from datetime import timedelta

    from health.services import reports_prune

    cluster = _cluster_with_reports(1)
    node = cluster.nodes.get()
    now = timezone.now().replace(minute=30)
    for minutes in range(0, 180, 10):  # 3 hours of reports, 2 days ago
        HealthReport.objects.create(node=node, time=now - timedelta(days=2, minutes=minutes))
    HealthReport.objects.create(node=node, time=now - timedelta(days=20))
    before = HealthReport.objects.count()
    deleted = reports_prune(now=now)
    old = HealthReport.objects.filter(time__lt=now - timedelta(days=1))
    assert old.count() in (3, 4)  # one per hour bucket the 3 hours touch
    assert deleted == before - HealthReport.objects.count()
    assert HealthReport.objects.filter(time__gt=now - timedelta(days=1)).count() == 1
