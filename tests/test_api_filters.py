"""List filters (mtc/api/filters.py): a query that names a filter narrows the list or is
a 400; one that names none lists everything, without building a FilterSet."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from clusters.models import Node, Operation
from mtc.api.filters import FilterBackend

from .test_pages import make_cluster


@pytest.fixture
def rows(db):
    cluster = make_cluster("fa", nodes=3)
    Node.objects.filter(cluster=cluster, name="fa-gpu-1").update(slurm_state="DRAIN")
    for state in ("SUCCEEDED", "SUCCEEDED", "FAILED"):
        Operation.objects.create(
            kind="CREATE_CLUSTER", target="clusters/fa", cluster=cluster, state=state
        )
    return cluster


def test_filters_narrow_and_bad_values_are_400(rows, operator_api):
    assert len(operator_api.get("/api/v1/operations").json()["results"]) == 3
    failed = operator_api.get("/api/v1/operations?state=FAILED").json()["results"]
    assert [op["state"] for op in failed] == ["FAILED"]
    assert operator_api.get("/api/v1/operations?state=NOPE").status_code == 400
    drained = operator_api.get("/api/v1/clusters/fa/nodes?slurm_state=DRAIN").json()["results"]
    assert [n["name"] for n in drained] == ["fa-gpu-1"]
    everything = operator_api.get("/api/v1/clusters/fa/nodes?page_size=100").json()["results"]
    assert len(everything) == Node.objects.filter(cluster=rows).count() > 1


def test_a_view_s_generated_filterset_is_made_once(rows, operator_api):
    FilterBackend._generated.clear()
    for _ in range(3):
        operator_api.get("/api/v1/operations?state=SUCCEEDED")
    made = [cls for (view, _model), cls in FilterBackend._generated.items() if _model is Operation]
    assert len(made) == 1
    with CaptureQueriesContext(connection) as plain:
        operator_api.get("/api/v1/operations")
    with CaptureQueriesContext(connection) as filtered:
        answer = operator_api.get("/api/v1/operations?state=SUCCEEDED&kind=CREATE_CLUSTER")
    assert [op["state"] for op in answer.json()["results"]] == ["SUCCEEDED", "SUCCEEDED"]
    assert len(plain) == len(filtered)
