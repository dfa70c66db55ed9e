from django.conf import settings
from django.db import models

from clusters.models import Cluster, Node, NodePool, Operation

from .choices import FailureState, RepairAction, RepairState


class HealthReport(models.Model):
    """One round of checks on a node: from its agent, or from the controller side."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="health_reports")
    time = models.DateTimeField()
    source = models.CharField(max_length=16, default="agent")  # agent | controller
    ok = models.BooleanField(default=True)
    checks = models.JSONField(default=list)
    findings = models.JSONField(default=list)

    class Meta:
        ordering = ["-time", "-id"]
        # time alone: the retention purge deletes by age across every node.
        indexes = [models.Index(fields=["node", "-time"]), models.Index(fields=["time"])]


class NodeFailure(models.Model):
    """A failure mode seen on a node, from first sight until a repair resolves it."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="failures")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="failures")
    mode = models.CharField(max_length=40)
    severity = models.CharField(max_length=10)
    message = models.CharField(max_length=500, blank=True)
    state = models.CharField(max_length=10, choices=FailureState.choices, default=FailureState.OPEN)
    repair_attempts = models.PositiveIntegerField(default=0)
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()
    resolved_time = models.DateTimeField(null=True, blank=True)
    # When the node's agent was asked for a deeper DCGM round because of this failure
    # (once per failure: a suspicion is checked, not re-checked every round).
    deep_check_time = models.DateTimeField(null=True, blank=True)
    # What else, besides the first agent report, has seen this failure: "" (nothing yet),
    # "repeat" (a later report of the agent), "controller" (a check mtc ran or saw itself),
    # "operator". A destructive repair (reimage, replace) needs it (health/policy.py).
    confirmed_by = models.CharField(max_length=16, blank=True, default="")

    class Meta:
        ordering = ["-first_seen", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "mode"],
                condition=~models.Q(state=FailureState.RESOLVED),
                name="one_unresolved_failure_per_node_and_mode",
            )
        ]


class Repair(models.Model):
    """One repair action on a node for a failure, with its Operation."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="repairs")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="repairs")
    failure = models.ForeignKey(
        NodeFailure, null=True, blank=True, on_delete=models.SET_NULL, related_name="repairs"
    )
    action = models.CharField(max_length=10, choices=RepairAction.choices)
    state = models.CharField(max_length=20, choices=RepairState.choices)
    attempt = models.PositiveIntegerField(default=1)
    message = models.CharField(max_length=500, blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    operation = models.ForeignKey(
        Operation, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    jobs_requeued = models.JSONField(default=list, blank=True)
    # The spare of the node's pool that took its place when the repair drained it.
    spare_node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    create_time = models.DateTimeField(auto_now_add=True)
    start_time = models.DateTimeField(null=True, blank=True)
    end_time = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-create_time", "-id"]
        indexes = [models.Index(fields=["cluster", "state"])]


class FabricCheck(models.Model):
    """One fabric check of a pool (health/fabric.py): its pairs, each pair's all-reduce
    figures, the floor they were judged by, and the nodes found bad."""

    class State(models.TextChoices):
        RUNNING = "RUNNING"
        PASSED = "PASSED"  # every node has a good pair
        FAILED = "FAILED"  # bad nodes found (bad_nodes)
        ERROR = "ERROR"  # the check itself did not run to the end (message)
        SKIPPED = "SKIPPED"  # fewer than two idle nodes

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="fabric_checks")
    pool = models.ForeignKey(NodePool, null=True, on_delete=models.SET_NULL, related_name="+")
    operation = models.ForeignKey(
        Operation, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    trigger = models.CharField(max_length=20)  # on-demand | create | repair
    state = models.CharField(max_length=10, choices=State.choices, default=State.RUNNING)
    job_id = models.CharField(max_length=20, blank=True)
    nodes = models.JSONField(default=list)
    passes = models.JSONField(default=list)  # [[[a, b], ...], ...]
    results = models.JSONField(default=list)  # node/fabric.py's lines, each with its pass
    floor_gbps = models.FloatField(null=True, blank=True)
    basis = models.CharField(max_length=200, blank=True)
    bad_nodes = models.JSONField(default=dict)  # node -> its failing pairs
    message = models.CharField(max_length=500, blank=True)
    create_time = models.DateTimeField(auto_now_add=True)
    end_time = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-create_time", "-id"]
        indexes = [models.Index(fields=["cluster", "-create_time"])]
