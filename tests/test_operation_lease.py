"""The Operation lease is a fence: a worker whose lease lapsed and was claimed again
by another can neither record progress nor finish; it learns so (Superseded)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from clusters import operations
from clusters.choices import OperationKind, OperationState
from clusters.models import Cluster, Operation

from .conftest import make_spec


@pytest.fixture
def operation(db):
    cluster = Cluster.objects.create(cluster_id="ls", spec=make_spec("ls"), state="CREATING")
    return Operation.objects.create(cluster=cluster, kind=OperationKind.CREATE_CLUSTER)


def expire(operation: Operation) -> None:
    Operation.objects.filter(pk=operation.pk).update(
        lease_expires=timezone.now() - timedelta(seconds=1)
    )


def test_claim_expire_claim_again_and_the_first_holder_writes_nothing(operation):
    first = operations.operation_claim(operation_id=operation.pk)
    assert first is not None and first.lease_token
    assert operations.operation_claim(operation_id=operation.pk) is None  # lease is live
    operations.operation_progress(first, 20, "first worker, step 1")

    expire(operation)  # the first worker stalls past its lease
    second = operations.operation_claim(operation_id=operation.pk)
    assert second is not None and second.lease_token != first.lease_token
    operations.operation_progress(second, 40, "second worker")

    before = Operation.objects.values().get(pk=operation.pk)
    with pytest.raises(operations.Superseded):
        operations.operation_progress(first, 90, "first worker wakes up")
    assert not operations._finish(first, OperationState.SUCCEEDED)
    operations.operation_fail(first, code="X", message="the stale worker failing")
    assert Operation.objects.values().get(pk=operation.pk) == before

    assert operations._finish(second, OperationState.SUCCEEDED)
    done = Operation.objects.get(pk=operation.pk)
    assert done.state == OperationState.SUCCEEDED and done.status_message == "Done"
    assert (
        Cluster.objects.get(pk=operation.cluster_id).state == "CREATING"
    )  # untouched by the stale fail
