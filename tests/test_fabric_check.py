"""The fabric check on a real 4-node local cluster: a node whose collective traffic is
throttled (the `fabric` fault) is found by two failing pairs, its partners are not."""

import pytest
from django.test import Client

from clusters import services as cluster_services
from clusters.models import Cluster
from clusters.providers import get_provider
from health.models import FabricCheck, NodeFailure

from .conftest import make_spec, sinfo_json
from .waiting import wait_until

pytestmark = pytest.mark.slurm

BAD = "fx-gpu-2"


def slurm_states(cluster) -> dict[str, str]:
    """{node: sinfo's state word} (idle, drained, ...): sinfo --json keeps DRAIN apart."""
    return {n.name: n.display_state for n in get_provider("local").slurm(cluster).nodes()}


@pytest.fixture
def cluster(local_clusters, settings):
    settings.MTC_FABRIC_CHECK_ON_CREATE = False
    settings.MTC_FABRIC_CHECK_ON_REPAIR = False
    cluster_services.cluster_create(spec=make_spec("fx", nodes=4))
    return Cluster.objects.get(cluster_id="fx")


def test_only_operators_may_ask_for_a_fabric_check(cluster, user_api):
    assert user_api.post("/api/v1/clusters/fx/fabric-check").status_code == 403
    assert not FabricCheck.objects.exists()


def test_a_throttled_node_is_found_by_its_two_failing_pairs(cluster, operator_api, operator):
    injected = operator_api.post(
        f"/api/v1/clusters/fx/nodes/{BAD}/faults", {"kind": "fabric"}, format="json"
    )
    assert injected.status_code == 202 and injected.json()["emulated"] is False
    try:
        response = operator_api.post("/api/v1/clusters/fx/fabric-check")
        assert response.status_code == 202, response.content
        operation = operator_api.get(f"/api/v1/operations/{response.json()['id']}").json()
        assert operation["state"] == "SUCCEEDED", operation
    finally:
        operator_api.delete(f"/api/v1/clusters/fx/nodes/{BAD}/faults?kind=fabric")

    check = FabricCheck.objects.get()
    took = (check.end_time - check.create_time).total_seconds()
    print(f"fabric check: {took:.1f} s; floor {check.basis}")
    for row in check.results:
        figures = f"{row['bus_gbps']} GB/s, {row['latency_us']} us"
        print(f"  pass {row['pass'] + 1} {row['nodes']}: {figures}")
    assert check.state == "FAILED", (check.message, check.results)
    assert len(check.results) == 4, check.results  # two passes of two pairs, all measured
    assert list(check.bad_nodes) == [BAD], (check.basis, check.results)
    failure = NodeFailure.objects.get(mode="FABRIC_DEGRADED")
    assert failure.node.name == BAD
    partners = {n for row in check.bad_nodes[BAD] for n in row["nodes"]} - {BAD}
    assert len(partners) == 2 and all(p in failure.message for p in partners), failure.message
    assert "GB/s" in failure.message and "floor" in failure.message
    assert not NodeFailure.objects.exclude(node__name=BAD).filter(mode="FABRIC_DEGRADED").exists()
    # Nothing held back: the reservation is gone and the good nodes take work again.
    states = sinfo_json("fx")
    assert all(states[f"fx-gpu-{i}"] == "idle" for i in (0, 1, 3)), states

    page = Client()
    page.force_login(operator)
    html = page.get(f"/clusters/fx/nodes/{BAD}/").content.decode()
    assert 'data-testid="fabric-verdict">degraded' in html
    assert all(f'data-partner="{p}"' in html for p in partners)
    good = page.get("/clusters/fx/nodes/fx-gpu-0/").content.decode()
    assert 'data-testid="fabric-verdict">passed' in good


def test_a_repaired_node_is_resumed_only_after_its_fabric_check_passed(
    cluster, operator_api, settings
):
    settings.MTC_FABRIC_CHECK_ON_REPAIR = True
    operator_api.post(f"/api/v1/clusters/fx/nodes/{BAD}/faults", {"kind": "fabric"}, format="json")
    try:
        answer = operator_api.post(
            f"/api/v1/clusters/fx/nodes/{BAD}/repair", {"action": "reboot"}, format="json"
        )
        assert answer.status_code == 202, answer.content
        repair = operator_api.get(f"/api/v1/clusters/fx/nodes/{BAD}/health").json()["repairs"][0]
        checked = FabricCheck.objects.filter(trigger="repair").first()
        assert repair["state"] == "FAILED" and "fabric check" in repair["message"], (
            repair,
            checked and (checked.basis, checked.results),
        )
        assert slurm_states(cluster)[BAD] == "drained"  # it takes no work
        check = FabricCheck.objects.get(trigger="repair")
        print("repair's fabric check:", [(r["nodes"], r["bus_gbps"]) for r in check.results])
        assert list(check.bad_nodes) == [BAD] and BAD in check.nodes
    finally:
        operator_api.delete(f"/api/v1/clusters/fx/nodes/{BAD}/faults?kind=fabric")
    # The fault gone, the next repair's check passes and the node is back in service.
    answer = operator_api.post(
        f"/api/v1/clusters/fx/nodes/{BAD}/repair", {"action": "reboot"}, format="json"
    )
    assert answer.status_code == 202, answer.content
    repair = operator_api.get(f"/api/v1/clusters/fx/nodes/{BAD}/health").json()["repairs"][0]
    assert repair["state"] == "SUCCEEDED", repair
    assert FabricCheck.objects.filter(trigger="repair").first().state == "PASSED"
    # Resumed: no longer drained (slurmd, just restarted, may be a moment from answering).
    wait_until(
        lambda: slurm_states(cluster)[BAD] == "idle",
        what=lambda: f"{BAD} idle (it is {slurm_states(cluster)[BAD]})",
        timeout=60,
    )


def test_a_new_cluster_is_checked_before_it_takes_work(local_clusters, settings):
    settings.MTC_FABRIC_CHECK_ON_CREATE = True
    operation = cluster_services.cluster_create(spec=make_spec("fy", nodes=2))
    operation.refresh_from_db()
    assert operation.state == "SUCCEEDED", operation.error_message
    check = FabricCheck.objects.get(cluster__cluster_id="fy")
    assert check.trigger == "create" and check.operation_id == operation.pk
    assert check.nodes == ["fy-gpu-0", "fy-gpu-1"] and len(check.results) == 1, check.message
    # Two nodes: one pair, nothing to compare it with on emulated nodes.
    assert check.state == "PASSED" and check.floor_gbps is None
    assert check.results[0]["bus_gbps"] > 0 and check.results[0]["backend"] == "gloo"
    states = sinfo_json("fy")
    assert states["fy-gpu-0"] == states["fy-gpu-1"] == "idle", states
