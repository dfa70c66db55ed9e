"""Who may do what, the error shape, pagination and the schema (no Slurm needed)."""

import pytest
from rest_framework.test import APIClient

from clusters.models import Cluster, NodePool

from .conftest import make_spec

pytestmark = pytest.mark.django_db


def test_anonymous_gets_401_json():
    response = APIClient().get("/api/v1/clusters")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "UNAUTHENTICATED"


def test_users_read_but_only_operators_write(user_api):
    assert user_api.get("/api/v1/clusters").status_code == 200
    response = user_api.post("/api/v1/clusters", make_spec("x"), format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "PERMISSION_DENIED"
    assert Cluster.objects.count() == 0


def test_unknown_cluster_is_404(user_api):
    response = user_api.get("/api/v1/clusters/nope")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "NOT_FOUND"
    assert user_api.get("/api/v1/clusters/nope/nodes").status_code == 404


def _bulk_clusters(count: int) -> None:
    for i in range(count):
        cluster = Cluster.objects.create(cluster_id=f"c{i:03d}", spec=make_spec(f"c{i:03d}"))
        NodePool.objects.create(cluster=cluster, pool_id="gpu", machine_type="local-2")


def test_list_pages_with_constant_queries(user_api, django_assert_max_num_queries):
    _bulk_clusters(60)
    with django_assert_max_num_queries(4):
        page = user_api.get("/api/v1/clusters").json()
    assert page["count"] == 60 and len(page["results"]) == 50
    assert page["results"][0]["cluster_id"] == "c000"
    second = user_api.get(page["next"]).json()
    assert [c["cluster_id"] for c in second["results"]][-1] == "c059"


def test_schema_builds(user_api):
    response = user_api.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    assert "/api/v1/clusters" in paths or "/api/v1/clusters/" in paths
    assert any("operations" in p for p in paths)


def test_healthz_needs_no_login(client):
    response = client.get("/healthz")
    assert response.status_code == 200 and response.content == b"ok"
