"""Redis (the task queue) down: writes that need a worker answer 503 and make nothing;
an enqueue lost after the write leaves the row for the reconcile to pick up."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery import current_app
from django.utils import timezone

from clusters import operations
from clusters.models import Cluster, Operation
from mtc.devstack import free_port

from .conftest import make_spec


@pytest.fixture
def broker_down(settings):
    """A broker URL where nothing listens, and Celery out of eager mode. Through
    Django's settings, which Celery's config reads: the fixture undoes it."""
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{free_port()}/0"
    yield
    # Celery keeps the connection pool it made for the dead URL: later tests need theirs.
    current_app._after_fork()


def test_create_with_the_queue_down_is_a_503_and_makes_nothing(db, operator_api, broker_down):
    response = operator_api.post("/api/v1/clusters", make_spec("qd", nodes=1), format="json")
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "UNAVAILABLE" and "task queue (Redis)" in error["message"]
    assert not Cluster.objects.exists() and not Operation.objects.exists()


def test_pages_say_the_queue_is_down(db, operator, client, broker_down, settings):
    cluster = Cluster.objects.create(cluster_id="qp", spec=make_spec("qp"), state="RUNNING")
    client.force_login(operator)
    response = client.post(f"/clusters/{cluster.cluster_id}/delete/", {"confirm": "qp"})
    assert response.status_code == 503
    assert "task queue (Redis) is not reachable" in response.content.decode()
    assert Cluster.objects.get(pk=cluster.pk).state == "RUNNING"
    assert client.get("/clusters/").status_code == 200  # pages keep serving


def test_an_enqueue_lost_after_the_write_is_picked_up_by_the_reconcile(
    db, operator_api, broker_down, settings, monkeypatch, django_capture_on_commit_callbacks
):
    monkeypatch.setattr("clusters.services.queue_require", lambda: None)  # Redis dies just after
    with django_capture_on_commit_callbacks(execute=True):
        response = operator_api.post("/api/v1/clusters", make_spec("ql", nodes=1), format="json")
    assert response.status_code == 202, response.content  # the send failed quietly
    operation = Operation.objects.get(cluster__cluster_id="ql")
    assert operation.state == "PENDING"
    Operation.objects.filter(pk=operation.pk).update(
        create_time=timezone.now() - timedelta(seconds=31)
    )
    settings.CELERY_TASK_ALWAYS_EAGER = True  # the broker is back
    sent = []
    monkeypatch.setattr(operations, "operation_enqueue", lambda op, **kw: sent.append(op.pk))
    assert operations.operations_resume() == [str(operation.pk)] and sent == [operation.pk]


def test_readyz_names_the_part_that_is_down(db, client, settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["redis"].startswith("error")
    assert response.json()["checks"]["database"] == "ok"
