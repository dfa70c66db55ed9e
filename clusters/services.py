"""Writes on clusters: create, update (resize, labels) and delete. Each returns an
Operation whose work a Celery task does (clusters.operations)."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from mtc.queue import queue_require, task_enqueue

from .choices import (
    CLUSTER_MUTABLE_STATES,
    OPERATION_ACTIVE_STATES,
    ClusterState,
    OperationKind,
    OperationState,
)
from .models import Cluster, Node, NodePool, Operation
from .spec import SpecError, validate_cluster_patch, validate_cluster_spec


class ClusterConflict(Exception):
    """The cluster's state does not allow this now (HTTP 409)."""

    def __init__(self, message: str, *, code: str = "FAILED_PRECONDITION", field: str = ""):
        super().__init__(message)
        self.code = code
        self.field = field


def machine_cpus(machine_type: str) -> int:
    """local-N has N CPUs; any cloud machine type maps to 2 on the local provider."""
    if machine_type.startswith("local-"):
        return int(machine_type.split("-", 1)[1])
    return 2


def _sync_pools(cluster: Cluster) -> None:
    """NodePool rows follow the spec (ids, machine, partitions, target counts)."""
    spec = cluster.spec
    slurm = spec["orchestrator_spec"]["slurm_spec"]
    for pool in spec["node_pools"]:
        machine = pool["machine_spec"]
        NodePool.objects.update_or_create(
            cluster=cluster,
            pool_id=pool["id"],
            defaults={
                "machine_type": machine["machine_type"],
                "cpus": machine_cpus(machine["machine_type"]),
                "accelerator_type": machine.get("accelerator_type", ""),
                "accelerator_count": machine.get("accelerator_count", 0) or 0,
                "is_login": pool["id"] == slurm["login_node_pool_id"],
                "partitions": [
                    p["id"] for p in slurm["partitions"] if pool["id"] in p["node_pool_ids"]
                ],
                "target_node_count": pool["scaling_spec"]["min_node_count"],
                "spare_node_count": pool.get("spare_node_count", 0),
            },
        )


def operation_enqueue(operation: Operation, *, countdown: float | None = None) -> None:
    """Run the Operation on a worker once the current transaction commits."""
    task_enqueue("clusters.tasks.operation_run", str(operation.pk), countdown=countdown)


def cluster_create(*, spec: Any, owner=None) -> Operation:
    """Validate ``spec`` and start creating the cluster. Raises SpecError or ClusterConflict."""
    clean = validate_cluster_spec(spec)
    queue_require()  # a cluster row no worker will ever build is a half-made resource
    if Cluster.objects.filter(cluster_id=clean["cluster_id"]).exists():
        raise ClusterConflict(
            f"A cluster with id '{clean['cluster_id']}' already exists.",
            code="ALREADY_EXISTS",
            field="cluster_id",
        )
    try:
        with transaction.atomic():
            cluster = Cluster.objects.create(
                cluster_id=clean["cluster_id"],
                display_name=clean["display_name"],
                provider=clean["provider"],
                spec=clean,
                labels=clean["labels"],
                owner=owner,
                state=ClusterState.CREATING,
            )
            _sync_pools(cluster)
            operation = Operation.objects.create(
                kind=OperationKind.CREATE_CLUSTER,
                target=f"clusters/{cluster.cluster_id}",
                cluster=cluster,
                owner=owner,
                status_message="Queued",
            )
            operation_enqueue(operation)
    except IntegrityError as exc:  # two creates raced for one id
        raise ClusterConflict(
            f"A cluster with id '{clean['cluster_id']}' already exists.",
            code="ALREADY_EXISTS",
            field="cluster_id",
        ) from exc
    return operation


def _active_operation(cluster: Cluster) -> Operation | None:
    """The Operation that holds the cluster; a repair still waiting its turn does not."""
    waiting_repair = Q(kind=OperationKind.REPAIR_NODE, state=OperationState.PENDING)
    return (
        cluster.operations.filter(state__in=OPERATION_ACTIVE_STATES).exclude(waiting_repair).first()
    )


def cluster_update(*, cluster: Cluster, patch: Any, owner=None) -> Operation:
    """Resize pools and change labels or display name (docs/api.md PATCH body)."""
    new_spec = validate_cluster_patch(cluster.spec, patch)
    queue_require()
    with transaction.atomic():
        locked = Cluster.objects.select_for_update().get(pk=cluster.pk)
        busy = _active_operation(locked)
        if busy or locked.state not in CLUSTER_MUTABLE_STATES:
            raise ClusterConflict(
                f"Cluster '{locked.cluster_id}' is {locked.state}"
                + (f" (operation {busy.pk} is {busy.state})" if busy else "")
                + "; try again when it is RUNNING."
            )
        locked.spec = new_spec
        locked.labels = new_spec["labels"]
        locked.display_name = new_spec["display_name"]
        locked.state = ClusterState.UPDATING
        locked.save()
        _sync_pools(locked)
        operation = Operation.objects.create(
            kind=OperationKind.UPDATE_CLUSTER,
            target=f"clusters/{locked.cluster_id}",
            cluster=locked,
            owner=owner,
            params={"patch": patch},
            status_message="Queued",
        )
        operation_enqueue(operation)
    return operation


def cluster_retry(*, cluster: Cluster, owner=None) -> Operation:
    """Run the reconcile again for a cluster whose last Operation failed (ERROR): what
    exists is kept, what is missing is made (e.g. after a stockout clears)."""
    queue_require()
    with transaction.atomic():
        locked = Cluster.objects.select_for_update().get(pk=cluster.pk)
        busy = _active_operation(locked)
        if busy or locked.state != ClusterState.ERROR:
            raise ClusterConflict(
                f"Cluster '{locked.cluster_id}' is {locked.state}; only a cluster in ERROR "
                "can be retried."
            )
        was_created = locked.operations.filter(
            kind=OperationKind.CREATE_CLUSTER, state=OperationState.SUCCEEDED
        ).exists()
        Cluster.objects.filter(pk=locked.pk).update(
            state=ClusterState.UPDATING if was_created else ClusterState.CREATING,
            update_time=timezone.now(),
        )
        operation = Operation.objects.create(
            kind=OperationKind.UPDATE_CLUSTER if was_created else OperationKind.CREATE_CLUSTER,
            target=f"clusters/{locked.cluster_id}",
            cluster=locked,
            owner=owner,
            params={"reason": "retry"},
            status_message="Queued (retry)",
        )
        operation_enqueue(operation)
    return operation


def cluster_delete(*, cluster: Cluster, owner=None) -> Operation:
    """Delete everything the cluster made. Supersedes a create or update in flight."""
    queue_require()
    with transaction.atomic():
        locked = Cluster.objects.select_for_update().get(pk=cluster.pk)
        existing = locked.operations.filter(
            kind=OperationKind.DELETE_CLUSTER, state__in=OPERATION_ACTIVE_STATES
        ).first()
        if existing:
            return existing
        now = timezone.now()
        locked.operations.filter(state__in=OPERATION_ACTIVE_STATES).update(
            state=OperationState.FAILED,
            error_code="ABORTED",
            error_message="Superseded by a delete.",
            end_time=now,
        )
        Cluster.objects.filter(pk=locked.pk).update(state=ClusterState.DELETING, update_time=now)
        operation = Operation.objects.create(
            kind=OperationKind.DELETE_CLUSTER,
            target=f"clusters/{locked.cluster_id}",
            cluster=locked,
            owner=owner,
            status_message="Queued",
        )
        operation_enqueue(operation)
    return operation


__all__ = [
    "ClusterConflict",
    "SpecError",
    "cluster_create",
    "cluster_delete",
    "cluster_retry",
    "cluster_update",
]


# --- agent tokens ----------------------------------------------------------
def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def node_token_issue(node: Node) -> str:
    """A new per-node token for the node's agent; only its hash is stored."""
    token = secrets.token_urlsafe(32)
    Node.objects.filter(pk=node.pk).update(agent_token_hash=_digest(token))
    node.agent_token_hash = _digest(token)
    return token


def node_token_valid(node: Node, token: str) -> bool:
    return bool(node.agent_token_hash) and secrets.compare_digest(
        node.agent_token_hash, _digest(token)
    )
