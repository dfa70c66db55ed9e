"""States with their named groups, in one place."""

from django.db import models


class ClusterState(models.TextChoices):
    CREATING = "CREATING"  # first Operation still running
    RUNNING = "RUNNING"  # every node up as asked
    UPDATING = "UPDATING"  # a resize or repair Operation is running
    DEGRADED = "DEGRADED"  # running, but some nodes are down or not responding
    ERROR = "ERROR"  # the last Operation failed; a retry or delete is needed
    DELETING = "DELETING"  # delete Operation running


# States in which the cluster's daemons should be up.
CLUSTER_LIVE_STATES = {ClusterState.RUNNING, ClusterState.UPDATING, ClusterState.DEGRADED}
# States in which a new PATCH or DELETE may start.
CLUSTER_MUTABLE_STATES = {ClusterState.RUNNING, ClusterState.DEGRADED, ClusterState.ERROR}


class OperationState(models.TextChoices):
    PENDING = "PENDING"  # queued, no worker has started it
    RUNNING = "RUNNING"  # a worker is reconciling
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


OPERATION_ACTIVE_STATES = {OperationState.PENDING, OperationState.RUNNING}
OPERATION_TERMINAL_STATES = {OperationState.SUCCEEDED, OperationState.FAILED}


class OperationKind(models.TextChoices):
    CREATE_CLUSTER = "CREATE_CLUSTER"
    UPDATE_CLUSTER = "UPDATE_CLUSTER"
    DELETE_CLUSTER = "DELETE_CLUSTER"
    REPAIR_NODE = "REPAIR_NODE"
    FABRIC_CHECK = "FABRIC_CHECK"  # the fabric check (health/fabric.py)


class NodeLifecycle(models.TextChoices):
    PROVISIONING = "PROVISIONING"  # row exists; the node's daemon may not run yet
    ACTIVE = "ACTIVE"  # part of the cluster
    DRAINING = "DRAINING"  # being removed: drained in Slurm, waiting for its jobs


# A node's reason while the cluster's controller does not answer: one outage of the
# whole cluster, not a failure of each node (health checks and repairs wait for it).
CONTROLLER_DOWN_REASON = "controller not answering"
