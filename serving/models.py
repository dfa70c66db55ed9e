"""Inference endpoints: a model version served by replicas that run as Slurm jobs."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from .choices import EndpointState, EventKind, ReplicaState


class Endpoint(models.Model):
    name = models.CharField(max_length=63)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="endpoints"
    )
    # PROTECT: the registry refuses to delete a version that is being served.
    version = models.ForeignKey(
        "registry.ModelVersion", on_delete=models.PROTECT, related_name="endpoints"
    )
    version_alias = models.CharField(
        max_length=32, blank=True, help_text="The alias it was deployed by, if any"
    )
    cluster = models.ForeignKey(
        "clusters.Cluster", on_delete=models.CASCADE, related_name="endpoints"
    )
    partition = models.CharField(max_length=64, blank=True)
    state = models.CharField(
        max_length=16, choices=EndpointState.choices, default=EndpointState.DEPLOYING
    )
    status_message = models.CharField(max_length=500, blank=True)
    chat = models.BooleanField(default=False, help_text="The version has a chat template")

    min_replicas = models.PositiveIntegerField(default=1)
    max_replicas = models.PositiveIntegerField(default=1)
    desired_replicas = models.PositiveIntegerField(default=1)
    cpus_per_replica = models.PositiveIntegerField(default=1)
    gpus_per_replica = models.PositiveIntegerField(default=0)
    # Autoscaling: replicas = ceil(request rate over the window / capacity), within
    # [min, max]; fewer only after the lower target has held for scale_down_delay_s.
    target_rps_per_replica = models.FloatField(default=4.0)
    load_window_s = models.PositiveIntegerField(default=30)
    scale_down_delay_s = models.PositiveIntegerField(default=60)
    scale_down_since = models.DateTimeField(null=True, blank=True)
    last_scale_time = models.DateTimeField(null=True, blank=True)

    # Replicas call mtc's requests with this bearer token; nobody else can call them.
    replica_token = models.CharField(max_length=64)
    replica_counter = models.PositiveIntegerField(default=0, help_text="Last replica number")
    failed_starts = models.PositiveIntegerField(
        default=0, help_text="Replicas in a row that died before they answered"
    )
    last_ready_time = models.DateTimeField(null=True, blank=True)
    create_time = models.DateTimeField(auto_now_add=True)
    update_time = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-create_time", "-id"]
        indexes = [models.Index(fields=["owner", "-create_time"])]

    def __str__(self) -> str:
        return f"{self.name} ({self.pk})"

    @property
    def served_model(self) -> str:
        """The model's name in answers (the replica's --name) and in OpenAI's /models."""
        return f"{self.version.model.name}@{self.version.number}"


class Replica(models.Model):
    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="replicas")
    number = models.PositiveIntegerField(help_text="1, 2, 3 ... per endpoint")
    state = models.CharField(
        max_length=16, choices=ReplicaState.choices, default=ReplicaState.STARTING
    )
    job = models.OneToOneField(
        "jobs.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="replica"
    )
    run_dir = models.CharField(max_length=500)
    host = models.CharField(max_length=255, blank=True)
    port = models.PositiveIntegerField(null=True, blank=True)
    health_message = models.CharField(max_length=500, blank=True)
    create_time = models.DateTimeField(auto_now_add=True)
    ready_time = models.DateTimeField(null=True, blank=True)
    last_health_time = models.DateTimeField(null=True, blank=True)
    unhealthy_since = models.DateTimeField(null=True, blank=True)
    stop_time = models.DateTimeField(null=True, blank=True)
    end_time = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["endpoint", "number"]
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "number"], name="replica_number_unique_per_endpoint"
            )
        ]
        indexes = [models.Index(fields=["endpoint", "state"])]

    def __str__(self) -> str:
        return f"{self.endpoint_id}/r{self.number}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}" if self.host and self.port else ""


class EndpointEvent(models.Model):
    """What happened to an endpoint: deploys, replicas coming and going, scaling."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="events")
    time = models.DateTimeField()
    kind = models.CharField(max_length=24, choices=EventKind.choices)
    message = models.CharField(max_length=500)

    class Meta:
        ordering = ["-time", "-id"]
        indexes = [models.Index(fields=["endpoint", "-time"])]


class EndpointRequest(models.Model):
    """One routed request, for the rate and latency figures and the autoscaler.
    Written in bulk by the reconcile from the list the router appends to in Redis."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="requests")
    time = models.DateTimeField(help_text="When the answer went back")
    latency_ms = models.FloatField()
    status = models.PositiveSmallIntegerField()
    replica_number = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        # time alone: the retention purge deletes by age across every endpoint.
        indexes = [models.Index(fields=["endpoint", "time"]), models.Index(fields=["time"])]
