"""Inference endpoints end to end on a real 2-node local cluster: deploy a registered
version, answer completions through mtc's API, replace a replica whose job was
scancelled, scale 1 -> 2 -> 1 on load, delete. The test plays the job poller and the
serving reconcile (no Celery worker in tests)."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from rest_framework.test import APIClient

from clusters import services as cluster_services
from clusters.models import Cluster
from jobs.choices import TERMINAL_STATES
from jobs.models import Job
from jobs.sync import jobs_sync
from serving.models import Endpoint, Replica
from serving.reconcile import endpoint_reconcile

from .conftest import cluster_root, make_spec
from .test_serving_support import redis_forget_serving, tiny_model_dir, version_make
from .waiting import wait_until

pytestmark = pytest.mark.slurm
__all__ = ["tiny_model_dir"]  # a fixture this module uses


@pytest.fixture
def cluster(local_clusters):
    redis_forget_serving()
    cluster_services.cluster_create(spec=make_spec("sv", nodes=2))
    return Cluster.objects.get(cluster_id="sv")


def tick(cluster) -> None:
    """One round of the control plane: the job poller, then each endpoint's reconcile."""
    jobs_sync(cluster=cluster)
    for endpoint_id in Endpoint.objects.values_list("id", flat=True):
        endpoint_reconcile(endpoint_id=endpoint_id)


def wait_serving(cluster, condition, *, what: str, timeout: float = 90, between=None):
    """Tick the serving pollers until ``condition()``; ``between`` replaces the pause (a
    request that loads the replicas, say)."""

    def before():
        tick(cluster)

    def done():
        if condition():
            return True
        if between:
            between()
        return False

    wait_until(
        done,
        before=before,
        every=0 if between else 0.2,
        timeout=timeout,
        what=lambda: f"{what}: {replica_states()}\n{last_replica_output()}",
    )


def last_replica_output() -> str:
    """The newest replica job's output, to say why a replica failed."""
    outputs = sorted(cluster_root("sv").glob("**/output/slurm-*.*"), key=os.path.getmtime)
    return "\n".join(p.read_text()[-2000:] for p in outputs[-2:]) or "(no job output)"


def replica_states() -> list[tuple[int, str, str]]:
    return list(Replica.objects.order_by("number").values_list("number", "state", "health_message"))


def ready_numbers(endpoint_id: int) -> list[int]:
    return sorted(
        Replica.objects.filter(endpoint_id=endpoint_id, state="READY").values_list(
            "number", flat=True
        )
    )


def complete(api, endpoint_id: int, **body):
    body = {"prompt": "hello world", "max_tokens": 4, "temperature": 0, **body}
    return api.post(f"/api/v1/endpoints/{endpoint_id}/completions", body, format="json")


def test_deploy_serve_replace_scale_and_delete(cluster, tiny_model_dir, user, user_api, client):
    version_make(tiny_model_dir, alias="prod")
    deployed = time.monotonic()
    response = user_api.post(
        "/api/v1/endpoints",
        {
            "model": "tiny",
            "version": "prod",
            "cluster": "sv",
            "min_replicas": 1,
            "max_replicas": 2,
            "target_rps_per_replica": 3,
            "load_window_s": 3,
            "scale_down_delay_s": 2,
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    endpoint_id = response.json()["id"]
    assert response.json()["version"] == 1 and response.json()["chat"] is True

    # Deploy -> answers through mtc's API within seconds.
    wait_serving(cluster, lambda: ready_numbers(endpoint_id) == [1], what="replica 1 ready")
    answer = complete(user_api, endpoint_id)
    ready_after = time.monotonic() - deployed
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["object"] == "text_completion" and body["model"] == "tiny@1"
    assert body["usage"]["completion_tokens"] <= 4 and body["usage"]["prompt_tokens"] > 0
    assert answer["X-MTC-Replica"] == "1"
    assert ready_after < 45, f"first answer after {ready_after:.1f} s"
    chat = user_api.post(
        f"/api/v1/endpoints/{endpoint_id}/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        format="json",
    )
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["role"] == "assistant"
    # The replica in its Slurm job streams too, through mtc, adding up to the whole answer.
    streamed = complete(user_api, endpoint_id, max_tokens=6, stream=True)
    assert streamed.status_code == 200 and streamed["Content-Type"] == "text/event-stream"
    events = b"".join(streamed.streaming_content).decode().split("\n\n")[:-1]
    assert events[-1] == "data: [DONE]", events
    texts = [json.loads(e[6:])["choices"][0]["text"] for e in events[:-1]]
    whole = complete(user_api, endpoint_id, max_tokens=6).json()["choices"][0]["text"]
    assert "".join(texts) == whole
    assert APIClient().post(
        f"/api/v1/endpoints/{endpoint_id}/completions", {"prompt": "hi"}, format="json"
    ).status_code in (401, 403)

    # scancel the replica's job: noticed, and a new replica takes its place.
    first = Replica.objects.get(endpoint_id=endpoint_id, number=1)
    subprocess.run(
        ["scancel", first.job.job_id],
        env=dict(os.environ, SLURM_CONF=str(cluster_root("sv") / "etc" / "slurm.conf")),
        check=True,
        timeout=20,
    )
    killed = time.monotonic()
    wait_serving(cluster, lambda: ready_numbers(endpoint_id) == [2], what="replica 2 replacing 1")
    back_after = time.monotonic() - killed
    first.refresh_from_db()
    assert first.state == "FAILED", replica_states()
    assert complete(user_api, endpoint_id)["X-MTC-Replica"] == "2"
    assert back_after < 60, f"replaced after {back_after:.1f} s"

    # Sustained load (well over 3 requests/s for 3 s) -> 2 replicas, both serving.
    served_by: set[str] = set()

    def load():
        for _ in range(4):
            response = complete(user_api, endpoint_id)
            assert response.status_code == 200, response.content
            served_by.add(response["X-MTC-Replica"])

    wait_serving(
        cluster,
        lambda: len(ready_numbers(endpoint_id)) == 2,
        what="a second replica under load",
        between=load,
    )
    assert Endpoint.objects.get(pk=endpoint_id).desired_replicas == 2
    for _ in range(5):
        load()
    assert len(served_by) == 2, served_by

    # The load stops -> back to one replica after the window and the delay.
    wait_serving(
        cluster,
        lambda: (
            Endpoint.objects.get(pk=endpoint_id).desired_replicas == 1
            and len(ready_numbers(endpoint_id)) == 1
            and not Replica.objects.filter(endpoint_id=endpoint_id, state="STOPPING").exists()
        ),
        what="scale down to one replica",
    )
    detail = user_api.get(f"/api/v1/endpoints/{endpoint_id}").json()
    assert detail["figures"]["requests"] > 10 and detail["figures"]["p50_ms"] > 0
    kinds = [e["kind"] for e in detail["events"]]
    assert kinds.count("SCALED") >= 2 and "REPLICA_FAILED" in kinds

    client.force_login(user)
    page = client.get(f"/endpoints/{endpoint_id}/").content.decode()
    live = Replica.objects.get(endpoint_id=endpoint_id, state="READY")
    assert f'data-replica="{live.number}" data-state="READY"' in page
    assert f"/clusters/sv/jobs/{live.job.job_id}/" in page  # the replica's job page

    # Delete: replicas stopped, the row goes (the version may be deleted again).
    job_ids = list(Replica.objects.filter(endpoint_id=endpoint_id).values_list("job_id", flat=True))
    assert user_api.delete(f"/api/v1/endpoints/{endpoint_id}").status_code in (202, 204)
    wait_serving(
        cluster, lambda: not Endpoint.objects.filter(pk=endpoint_id).exists(), what="delete"
    )
    states = set(Job.objects.filter(pk__in=job_ids).values_list("state", flat=True))
    assert states <= TERMINAL_STATES, states
