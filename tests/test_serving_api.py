"""Endpoints API and pages without Slurm: deploy checks, who sees what, routing to an
in-process replica (least outstanding, failover, 503), the figures, and the pages."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from clusters.models import Cluster
from serving import routing
from serving.autoscale import autoscale_decide, autoscale_target
from serving.models import Endpoint, EndpointRequest, Replica
from serving.reconcile import requests_ingest

from .conftest import make_spec
from .pages import assert_loads_nothing_remote
from .test_serving_support import (
    redis_forget_serving,
    replica_server,
    tiny_model_dir,
    version_make,
)

__all__ = ["replica_server", "tiny_model_dir"]  # fixtures these tests use


@pytest.fixture
def cluster(db):
    return Cluster.objects.create(cluster_id="sa", spec=make_spec("sa", nodes=2), state="RUNNING")


@pytest.fixture
def version(db, tiny_model_dir):
    redis_forget_serving()
    return version_make(tiny_model_dir, alias="prod")


@pytest.fixture
def outsider_api(django_user_model) -> APIClient:
    client = APIClient()
    client.force_authenticate(django_user_model.objects.create_user("otto", password="pw-otto-1"))
    return client


def endpoint_make(version, cluster, owner, *, chat: bool = True, **fields) -> Endpoint:
    return Endpoint.objects.create(
        name="tiny-1",
        owner=owner,
        version=version,
        cluster=cluster,
        chat=chat,
        replica_token="test-replica-token",
        state="READY",
        **fields,
    )


def replica_make(endpoint: Endpoint, number: int, host: str, port: int) -> Replica:
    return Replica.objects.create(
        endpoint=endpoint, number=number, state="READY", host=host, port=port, run_dir="/none"
    )


def deploy_fields(api, body: dict) -> dict:
    response = api.post("/api/v1/endpoints", body, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "INVALID_ARGUMENT"
    return error["fields"]


def test_deploy_checks_name_each_bad_field(cluster, version, user_api, tmp_path):
    from registry.models import ModelVersion

    ok = {"model": "tiny", "version": 1, "cluster": "sa"}
    assert set(deploy_fields(user_api, {})) >= {"model", "cluster"}
    assert "model" in deploy_fields(user_api, {**ok, "model": "nope"})
    assert "no version 9" in deploy_fields(user_api, {**ok, "version": 9})["version"]
    assert "no alias 'beta'" in deploy_fields(user_api, {**ok, "version": "beta"})["version"]
    assert "cluster" in deploy_fields(user_api, {**ok, "cluster": "nope"})
    fields = deploy_fields(user_api, {**ok, "min_replicas": 3, "max_replicas": 2})
    assert list(fields) == ["max_replicas"]
    assert "gpus_per_replica" in deploy_fields(user_api, {**ok, "gpus_per_replica": 9})
    assert "partition" in deploy_fields(user_api, {**ok, "partition": "nope"})
    assert "target_rps_per_replica" in deploy_fields(user_api, {**ok, "target_rps_per_replica": 0})
    assert "colour" in deploy_fields(user_api, {**ok, "colour": "red"})
    ModelVersion.objects.create(model=version.model, number=2, state="PENDING")
    assert "PENDING" in deploy_fields(user_api, {**ok, "version": 2})["version"]
    ModelVersion.objects.create(
        model=version.model, number=3, state="READY", export_path=str(tmp_path)
    )
    assert "no exported model" in deploy_fields(user_api, {**ok, "version": 3})["version"]
    cluster.state = "CREATING"
    cluster.save()
    assert "CREATING" in deploy_fields(user_api, ok)["cluster"]


def test_endpoints_need_a_login_and_stay_private(
    cluster, version, user, user_api, outsider_api, operator_api
):
    endpoint = endpoint_make(version, cluster, user)
    anonymous = APIClient()
    assert anonymous.get("/api/v1/endpoints").status_code == 401
    assert anonymous.post(f"/api/v1/endpoints/{endpoint.pk}/completions", {}).status_code == 401
    assert outsider_api.get("/api/v1/endpoints").json()["count"] == 0
    assert outsider_api.get(f"/api/v1/endpoints/{endpoint.pk}").status_code == 404
    response = outsider_api.post(
        f"/api/v1/endpoints/{endpoint.pk}/completions", {"prompt": "hi"}, format="json"
    )
    assert response.status_code == 404
    assert outsider_api.delete(f"/api/v1/endpoints/{endpoint.pk}").status_code == 404
    assert operator_api.get(f"/api/v1/endpoints/{endpoint.pk}").json()["owner"] == "uma"
    listed = user_api.get("/api/v1/endpoints").json()["results"]
    assert [e["id"] for e in listed] == [endpoint.pk] and listed[0]["model"] == "tiny"


def test_routing_failover_figures_and_503(
    cluster, version, user, user_api, replica_server, monkeypatch
):
    server, _token = replica_server
    host, port = server.server_address[:2]
    endpoint = endpoint_make(version, cluster, user, chat=False)
    replica_make(endpoint, 1, host, port)
    url = f"/api/v1/endpoints/{endpoint.pk}/completions"

    response = user_api.post(url, {"prompt": "hello", "max_tokens": 3}, format="json")
    assert response.status_code == 200, response.content
    assert response["X-MTC-Replica"] == "1" and response.json()["model"] == "tiny@1"

    # mtc checks the request first and answers in its own error shape.
    bad = user_api.post(url, {"prompt": "hello", "max_tokens": 0}, format="json")
    assert bad.status_code == 400 and list(bad.json()["error"]["fields"]) == ["max_tokens"]
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    refused = user_api.post(url, chat, format="json")
    assert refused.status_code == 400 and "messages" in refused.json()["error"]["fields"]
    endpoint.chat = True
    endpoint.save()
    answered = user_api.post(url, chat, format="json")
    assert answered.json()["object"] == "chat.completion"

    # A replica that cannot be reached is marked unhealthy; the request goes elsewhere.
    # Ties are broken newest first here, so the dead one is met on the first request.
    monkeypatch.setattr(routing, "tie_break", lambda rs: rs.sort(key=lambda r: -r.number))
    dead = replica_make(endpoint, 2, "127.0.0.1", 9)  # the discard port: nothing listens
    for _ in range(4):
        response = user_api.post(url, {"prompt": "hi", "max_tokens": 2}, format="json")
        assert response.status_code == 200 and response["X-MTC-Replica"] == "1"
    dead.refresh_from_db()
    assert dead.state == "UNHEALTHY" and "unreachable" in dead.health_message

    assert requests_ingest(endpoint) == 6  # the two refused by the checks never left mtc
    detail = user_api.get(f"/api/v1/endpoints/{endpoint.pk}").json()
    assert detail["figures"]["requests"] == 6 and detail["figures"]["p99_ms"] > 0
    series = user_api.get(f"/api/v1/endpoints/{endpoint.pk}/metrics?window=60").json()
    assert sum(p["requests_per_s"] for p in series["series"]) * series["bucket_s"] == 6
    assert user_api.get(f"/api/v1/endpoints/{endpoint.pk}/metrics?window=5").status_code == 400

    Replica.objects.filter(endpoint=endpoint).update(state="STARTING")
    response = user_api.post(url, {"prompt": "hi"}, format="json")
    assert response.status_code == 503
    assert "no healthy replica" in response.json()["error"]["message"]
    assert "2 starting" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "provider, state, address",
    [
        ("local", {"host": "127.0.0.1", "port": 8001}, ("127.0.0.1", 8001)),
        ("gce", {"host": "sa-gpu-0", "port": "8001"}, ("sa-gpu-0", 8001)),
        ("gce", {"host": "sa-gpu-0.c.p.internal", "port": 8001}, ("sa-gpu-0.c.p.internal", 8001)),
        ("gce", {"host": "h" * 256, "port": 8001}, None),  # longer than Replica.host
        ("gce", {"host": "a\x00b", "port": 8001}, None),  # PostgreSQL stores no NUL
        ("gce", {"host": "sa-gpu-0", "port": 2**40}, None),  # past the integer column
        ("gce", {"host": "sa-gpu-0"}, None),
        ("gce", {"host": "sa-gpu-0", "port": "x"}, None),
        ("gce", {"host": "sa-gpu-0", "port": 8001, "job_id": "other"}, None),  # an earlier run's
        # Anywhere but the replica's own node: mtc would carry the endpoint's token and a
        # user's prompts there, and answer with what it said (the metadata server, a database).
        ("gce", {"host": "169.254.169.254", "port": 80}, None),
        ("gce", {"host": "sa-gpu-01", "port": 8001}, None),
        ("gce", {"host": "sa-gpu-0evil.example", "port": 8001}, None),
        ("local", {"host": "10.0.0.7", "port": 8001}, None),
    ],
)
def test_a_replica_address_is_taken_only_on_the_replicas_node(
    cluster, version, user, tmp_path, provider, state, address
):
    from jobs.models import Job
    from serving.reconcile import replica_address

    Cluster.objects.filter(pk=cluster.pk).update(provider=provider)
    job = Job.objects.create(
        cluster=cluster, job_id="41", job_number=41, name="replica", node_list="sa-gpu-0"
    )
    (tmp_path / "replica.json").write_text(json.dumps({"job_id": "41", **state}))
    endpoint = endpoint_make(version, cluster, user)
    replica = Replica.objects.create(endpoint=endpoint, number=1, job=job, run_dir=str(tmp_path))
    assert replica_address(Replica.objects.get(pk=replica.pk)) == address


def test_autoscale_policy():
    assert autoscale_target(rate=0, capacity=4, low=1, high=3) == 1
    assert autoscale_target(rate=4, capacity=4, low=1, high=3) == 1
    assert autoscale_target(rate=4.1, capacity=4, low=1, high=3) == 2
    assert autoscale_target(rate=100, capacity=4, low=1, high=3) == 3
    now = timezone.now()
    assert (
        autoscale_decide(current=1, target=3, now=now, scale_down_since=None, delay_s=60).desired
        == 3
    )
    waiting = autoscale_decide(current=3, target=1, now=now, scale_down_since=None, delay_s=60)
    assert waiting.desired == 3 and waiting.scale_down_since == now
    later = now + timedelta(seconds=61)
    assert (
        autoscale_decide(current=3, target=1, now=later, scale_down_since=now, delay_s=60).desired
        == 1
    )
    back_up = autoscale_decide(current=3, target=3, now=later, scale_down_since=now, delay_s=60)
    assert back_up.desired == 3 and back_up.scale_down_since is None


def test_pages(cluster, version, user, client):
    client.force_login(user)
    assert client.get("/endpoints/").status_code == 200
    page = client.get("/endpoints/deploy/")
    assert page.status_code == 200 and b'value="tiny"' in page.content
    refused = client.post("/endpoints/deploy/", {"model": "tiny", "version": "9", "cluster": "sa"})
    assert refused.status_code == 200 and b"has no version 9" in refused.content
    deployed = client.post(
        "/endpoints/deploy/",
        {
            "model": "tiny",
            "version": "prod",
            "cluster": "sa",
            "min_replicas": "1",
            "max_replicas": "2",
        },
    )
    endpoint = Endpoint.objects.get()
    assert deployed.status_code == 302 and deployed["Location"] == f"/endpoints/{endpoint.pk}/"
    assert endpoint.version_alias == "prod" and endpoint.max_replicas == 2

    Endpoint.objects.filter(pk=endpoint.pk).update(status_message="<script>alert(1)</script>")
    EndpointRequest.objects.create(
        endpoint=endpoint, time=timezone.now(), latency_ms=12.5, status=200, replica_number=1
    )
    detail = client.get(f"/endpoints/{endpoint.pk}/")
    html = detail.content.decode()
    assert detail.status_code == 200
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>alert(1)" not in html
    assert "/vendor/plotly.min.js" in html
    assert_loads_nothing_remote(html)
    assert 'id="try-it"' in html and "12.5 ms" in html
    listing = client.get("/endpoints/").content.decode()
    assert f'href="/endpoints/{endpoint.pk}/"' in listing

    client.post(f"/endpoints/{endpoint.pk}/delete/")
    assert Endpoint.objects.get().state == "DELETING"


def test_openapi_documents_the_endpoints(operator_api):
    schema = operator_api.get("/api/schema/?format=json").json()
    for path in (
        "/api/v1/endpoints",
        "/api/v1/endpoints/{endpoint_id}",
        "/api/v1/endpoints/{endpoint_id}/completions",
    ):
        assert any(p.rstrip("/") == path for p in schema["paths"]), path
