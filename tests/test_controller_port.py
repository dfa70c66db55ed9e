"""Reserving a cluster's controller port when another cluster took the port first."""

from __future__ import annotations

from clusters import operations
from clusters.models import Cluster

from .conftest import make_spec


def test_a_port_taken_meanwhile_is_retried_and_the_transaction_goes_on(db, monkeypatch):
    Cluster.objects.create(
        cluster_id="pa", spec=make_spec("pa"), state="RUNNING", controller_port=41001
    )
    late = Cluster.objects.create(cluster_id="pb", spec=make_spec("pb"), state="CREATING")
    # The first allocation loses the race to "pa"; the unique column refuses it.
    offers = iter([[41001], [41002]])
    monkeypatch.setattr(operations, "allocate_ports", lambda count: next(offers))

    operations._ensure_controller_port(late)  # inside the test's transaction

    assert late.controller_port == 41002
    # The refused UPDATE left the surrounding transaction usable (PostgreSQL aborts it).
    assert Cluster.objects.get(cluster_id="pb").controller_port == 41002
