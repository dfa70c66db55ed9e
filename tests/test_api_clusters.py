"""The cluster API against real local Slurm (docs/api.md)."""

import pytest

from clusters.models import Cluster, Node, Operation

from .conftest import cluster_processes, cluster_root, make_spec, sinfo_json

pytestmark = pytest.mark.slurm


def _create(api, spec) -> dict:
    response = api.post("/api/v1/clusters", spec, format="json")
    assert response.status_code == 202, response.content
    return response.json()


def _operation(api, op_id) -> dict:
    response = api.get(f"/api/v1/operations/{op_id}")
    assert response.status_code == 200
    return response.json()


def _resize(api, cluster_id, count) -> dict:
    body = {
        "node_pools": [
            {"id": "gpu", "scaling_spec": {"min_node_count": count, "max_node_count": count}}
        ]
    }
    response = api.patch(f"/api/v1/clusters/{cluster_id}", body, format="json")
    assert response.status_code == 202, response.content
    return _operation(api, response.json()["id"])


def test_create_resize_delete_through_real_slurm(local_clusters, operator_api):
    op = _create(operator_api, make_spec("t3", nodes=3))
    assert op["kind"] == "CREATE_CLUSTER" and op["target"] == "clusters/t3"
    op = _operation(operator_api, op["id"])
    assert op["state"] == "SUCCEEDED" and op["done"] is True and op["progress"] == 100
    assert sinfo_json("t3") == {f"t3-gpu-{i}": "idle" for i in range(3)}

    cluster = operator_api.get("/api/v1/clusters/t3").json()
    assert cluster["state"] == "RUNNING"
    assert cluster["node_count"] == 3 and cluster["ready_node_count"] == 3
    assert cluster["gpu_count"] == 24

    assert _resize(operator_api, "t3", 5)["state"] == "SUCCEEDED"
    assert sinfo_json("t3") == {f"t3-gpu-{i}": "idle" for i in range(5)}
    assert _resize(operator_api, "t3", 2)["state"] == "SUCCEEDED"
    assert sinfo_json("t3") == {"t3-gpu-0": "idle", "t3-gpu-1": "idle"}

    nodes = operator_api.get("/api/v1/clusters/t3/nodes").json()
    assert [n["name"] for n in nodes["results"]] == ["t3-gpu-0", "t3-gpu-1"]
    assert nodes["results"][0]["gpus"] == {"count": 8, "type": "h200", "emulated": True}
    assert nodes["results"][0]["partition"] == "gpu"

    assert cluster_processes("t3")
    response = operator_api.delete("/api/v1/clusters/t3")
    assert response.status_code == 202
    assert _operation(operator_api, response.json()["id"])["state"] == "SUCCEEDED"
    assert cluster_processes("t3") == []
    assert not cluster_root("t3").exists()
    assert operator_api.get("/api/v1/clusters/t3").status_code == 404


def test_two_clusters_side_by_side(local_clusters, operator_api):
    for cluster_id in ("left", "right"):
        op = _create(operator_api, make_spec(cluster_id, nodes=2))
        assert _operation(operator_api, op["id"])["state"] == "SUCCEEDED"
    assert sinfo_json("left") == {"left-gpu-0": "idle", "left-gpu-1": "idle"}
    assert sinfo_json("right") == {"right-gpu-0": "idle", "right-gpu-1": "idle"}
    ports = list(Cluster.objects.values_list("controller_port", flat=True))
    ports += list(Node.objects.values_list("port", flat=True))
    assert len(ports) == len(set(ports)) == 6


def test_spec_error_paths_and_nothing_created(local_clusters, operator_api):
    spec = make_spec("bad")
    spec["cluster_id"] = "Bad_Id"
    spec["node_pools"][1]["scaling_spec"]["min_node_count"] = -3
    spec["node_pools"][1]["machine_spec"]["accelerator_count"] = "8"
    spec["orchestrator_spec"]["slurm_spec"]["partitions"][0]["node_pool_ids"] = ["nope"]
    del spec["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"]
    response = operator_api.post("/api/v1/clusters", spec, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "INVALID_ARGUMENT"
    assert set(error["fields"]) == {
        "cluster_id",
        "node_pools[1].scaling_spec.min_node_count",
        "node_pools[1].machine_spec.accelerator_count",
        "orchestrator_spec.slurm_spec.partitions[0].node_pool_ids[0]",
        "orchestrator_spec.slurm_spec.login_node_pool_id",
    }
    assert "node_pools[1].scaling_spec.min_node_count" in error["message"]
    assert Cluster.objects.count() == 0 and Operation.objects.count() == 0
    assert not (cluster_root("bad")).exists()

    response = operator_api.post("/api/v1/clusters", "[1, 2", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "PARSE_ERROR"


def test_duplicate_id_and_busy_cluster_conflict(local_clusters, operator_api):
    _create(operator_api, make_spec("dup", nodes=1))
    response = operator_api.post("/api/v1/clusters", make_spec("dup", nodes=1), format="json")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "ALREADY_EXISTS"
    Cluster.objects.filter(cluster_id="dup").update(state="UPDATING")
    body = {"labels": {"team": "x"}}
    response = operator_api.patch("/api/v1/clusters/dup", body, format="json")
    assert response.status_code == 409
    assert "UPDATING" in response.json()["error"]["message"]


def test_patch_errors_name_fields(local_clusters, operator_api):
    _create(operator_api, make_spec("pt", nodes=1))
    body = {"node_pools": [{"id": "ghost", "scaling_spec": {"min_node_count": 1}}]}
    response = operator_api.patch("/api/v1/clusters/pt", body, format="json")
    assert response.status_code == 400
    assert "node_pools[0].id" in response.json()["error"]["fields"]
    assert (
        Cluster.objects.get(cluster_id="pt").spec["node_pools"][1]["scaling_spec"]["min_node_count"]
        == 1
    )


def test_gce_cluster_without_a_project_fails_clearly_and_deletes(
    local_clusters, operator_api, settings
):
    settings.MTC_GCE_PROJECT = ""
    spec = make_spec("cloud", provider="gce", zone="us-central1-a")
    spec["node_pools"][0]["machine_spec"]["machine_type"] = "n2-standard-8"
    spec["node_pools"][1]["machine_spec"]["machine_type"] = "a3-ultragpu-8g"
    op = _operation(operator_api, _create(operator_api, spec)["id"])
    assert op["state"] == "FAILED" and op["error"]["code"] == "GCE_NOT_CONFIGURED"
    assert "MTC_GCE_PROJECT" in op["error"]["message"]
    assert operator_api.get("/api/v1/clusters/cloud").json()["state"] == "ERROR"
    response = operator_api.delete("/api/v1/clusters/cloud")
    assert _operation(operator_api, response.json()["id"])["state"] == "SUCCEEDED"
    assert not Cluster.objects.filter(cluster_id="cloud").exists()
