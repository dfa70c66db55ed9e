"""Failure modes, repair actions and their states, in one place."""

from django.db import models


class Severity(models.TextChoices):
    CRITICAL = "critical"  # the node must leave service
    WARNING = "warning"  # noted; no repair on its own


class RepairAction(models.TextChoices):
    DRAIN = "drain"  # out of service, for a person to look at
    REBOOT = "reboot"  # restart the node (local: its slurmd)
    REIMAGE = "reimage"  # wipe the node's state and start it fresh
    REPLACE = "replace"  # a new machine under the same name


class RepairState(models.TextChoices):
    PENDING_APPROVAL = "PENDING_APPROVAL"  # waits for an operator (cluster asks for approval)
    WAITING = "WAITING"  # held back: too much of the pool is already in repair
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"  # the node passed its checks and is back in service
    FAILED = "FAILED"  # the action or the checks after it failed (escalates)
    CANCELLED = "CANCELLED"


REPAIR_ACTIVE_STATES = {RepairState.PENDING_APPROVAL, RepairState.WAITING, RepairState.RUNNING}


class FailureState(models.TextChoices):
    OPEN = "OPEN"
    REPAIRING = "REPAIRING"
    RESOLVED = "RESOLVED"


class NodeHealth(models.TextChoices):
    UNKNOWN = "UNKNOWN"  # no report yet
    HEALTHY = "HEALTHY"
    WARNING = "WARNING"
    FAILED = "FAILED"  # a critical failure is open
    REPAIRING = "REPAIRING"
