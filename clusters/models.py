import uuid

from django.conf import settings
from django.db import models

from .choices import ClusterState, NodeLifecycle, OperationKind, OperationState


class Cluster(models.Model):
    cluster_id = models.SlugField(max_length=31, unique=True)
    display_name = models.CharField(max_length=200, blank=True)
    provider = models.CharField(max_length=20, default="local")
    spec = models.JSONField(help_text="The validated cluster spec (docs/spec.md).")
    labels = models.JSONField(default=dict, blank=True)
    state = models.CharField(
        max_length=12, choices=ClusterState.choices, default=ClusterState.CREATING
    )
    state_message = models.CharField(max_length=500, blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    controller_port = models.PositiveIntegerField(null=True, unique=True)
    # What a cloud provider made that is not found by label (e.g. a network mtc created).
    provider_state = models.JSONField(default=dict, blank=True)
    # Repair policy switches (health app): operators approve each repair, and at most
    # this share of a pool is out of service for repairs at once.
    repair_requires_approval = models.BooleanField(default=False)
    repair_max_fraction = models.FloatField(default=0.25)
    create_time = models.DateTimeField(auto_now_add=True)
    update_time = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster_id"]

    def __str__(self) -> str:
        return self.cluster_id


class NodePool(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="pools")
    pool_id = models.SlugField(max_length=31)
    machine_type = models.CharField(max_length=100)
    cpus = models.PositiveIntegerField(default=2)
    accelerator_type = models.CharField(max_length=100, blank=True)
    accelerator_count = models.PositiveIntegerField(default=0)
    is_login = models.BooleanField(default=False)
    partitions = models.JSONField(default=list, help_text="Slurm partitions this pool is in.")
    target_node_count = models.PositiveIntegerField(default=0)
    # Nodes held idle (drained with reason "spare") to stand in at once for a node a
    # repair takes out (clusters/spares.py).
    spare_node_count = models.PositiveIntegerField(default=0)
    # The median of its nodes' latest speed figures (health's speed check), kept for a
    # short while so that a report is judged without reading the whole pool each time.
    speed_median = models.FloatField(null=True, blank=True)
    speed_median_time = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["cluster", "pool_id"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "pool_id"], name="pool_unique_per_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.cluster.cluster_id}/{self.pool_id}"


class Node(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    pool = models.ForeignKey(NodePool, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=80)
    index = models.PositiveIntegerField(help_text="Position in its pool; names derive from it.")
    lifecycle = models.CharField(
        max_length=12, choices=NodeLifecycle.choices, default=NodeLifecycle.PROVISIONING
    )
    partition = models.CharField(max_length=200, blank=True)
    slurm_state = models.CharField(max_length=40, default="UNKNOWN")
    slurm_reason = models.CharField(max_length=300, blank=True)
    health = models.CharField(max_length=40, default="UNKNOWN")
    health_message = models.CharField(max_length=300, blank=True)
    last_report_time = models.DateTimeField(null=True, blank=True)
    # GFLOP/s of the speed check in the agent's latest report (None: it had none).
    speed_gflops = models.FloatField(null=True, blank=True)
    # A hot spare: healthy, held out of work in Slurm (DRAIN, reason "spare") until a
    # repair takes another node of its pool out (clusters/spares.py).
    spare = models.BooleanField(default=False)
    agent_token_hash = models.CharField(max_length=64, blank=True)
    gpus = models.PositiveIntegerField(default=0)
    gpu_type = models.CharField(max_length=40, blank=True)
    gpus_emulated = models.BooleanField(default=False)
    cpus = models.PositiveIntegerField(default=2)
    port = models.PositiveIntegerField(null=True, unique=True)
    provider_id = models.CharField(max_length=300, blank=True)
    state_time = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["cluster", "pool__pool_id", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "name"], name="node_name_unique_per_cluster"
            ),
            models.UniqueConstraint(fields=["pool", "index"], name="node_index_unique_per_pool"),
        ]

    def __str__(self) -> str:
        return self.name


class Operation(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=20, choices=OperationKind.choices)
    target = models.CharField(max_length=200, help_text="e.g. clusters/demo")
    cluster = models.ForeignKey(
        Cluster, null=True, blank=True, on_delete=models.SET_NULL, related_name="operations"
    )
    state = models.CharField(
        max_length=10, choices=OperationState.choices, default=OperationState.PENDING
    )
    progress = models.PositiveSmallIntegerField(default=0)
    status_message = models.CharField(max_length=500, blank=True)
    params = models.JSONField(default=dict, blank=True)
    error_code = models.CharField(max_length=60, blank=True)
    error_message = models.TextField(blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    attempts = models.PositiveIntegerField(default=0)
    # A worker holds an Operation while its lease runs; an expired lease means the
    # worker died and another may take over (compare-and-swap on this field).
    lease_expires = models.DateTimeField(null=True, blank=True)
    # The fence: who holds the lease now. A worker whose lease lapsed and was taken
    # by another writes nothing more (every write matches its own token).
    lease_token = models.CharField(max_length=32, blank=True, default="")
    create_time = models.DateTimeField(auto_now_add=True)
    start_time = models.DateTimeField(null=True, blank=True)
    end_time = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-create_time"]
        indexes = [
            models.Index(fields=["state"]),
            # A page of the list, newest first, without sorting every operation kept.
            models.Index(fields=["-create_time"], name="operation_newest"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.target} {self.state}"

    @property
    def done(self) -> bool:
        return self.state in (OperationState.SUCCEEDED, OperationState.FAILED)


class SlurmAccount(models.Model):
    """A team's Slurm account as operators defined it. slurmdbd holds the limits that
    Slurm enforces; mtc keeps this record to make the account (and its members'
    associations) on each cluster a job of theirs goes to, and to check who may
    submit under it without asking Slurm."""

    name = models.CharField(max_length=40, unique=True)
    description = models.CharField(max_length=200, blank=True)
    shares = models.PositiveIntegerField(null=True, blank=True)
    qos = models.CharField(max_length=200, blank=True)
    grp_tres = models.CharField(max_length=200, blank=True)
    grp_tres_mins = models.CharField(max_length=200, blank=True)
    max_tres_per_user = models.CharField(max_length=200, blank=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, related_name="slurm_accounts", blank=True
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class SlurmAssociation(models.Model):
    """What mtc has made in slurmdbd for a cluster: an account (user "") or a user's
    association under it, so a submit asks sacctmgr only the first time."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    account = models.CharField(max_length=40)
    user = models.CharField(max_length=32, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "account", "user"], name="slurm_association_unique"
            )
        ]
