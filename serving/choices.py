"""Endpoint and replica states, with the named groups services and pages use."""

from django.db import models


class EndpointState(models.TextChoices):
    DEPLOYING = "DEPLOYING"  # replicas starting; none has answered yet
    READY = "READY"  # at least one replica answers
    DEGRADED = "DEGRADED"  # it served before, now no replica answers (restarting them)
    FAILED = "FAILED"  # replicas kept dying before they answered; mtc stopped restarting
    DELETING = "DELETING"  # stopping its replicas; the row goes once they are stopped


class ReplicaState(models.TextChoices):
    STARTING = "STARTING"  # job submitted; waiting for it to run and answer /health
    READY = "READY"  # answers: requests are routed to it
    UNHEALTHY = "UNHEALTHY"  # failed a request or a health check; not routed to
    STOPPING = "STOPPING"  # mtc cancelled its job (scale down, replace, delete)
    STOPPED = "STOPPED"  # its job ended after mtc stopped it
    FAILED = "FAILED"  # its job ended without mtc asking, or it never answered


# Replicas that count towards the endpoint's size (mtc wants their job running).
LIVE_REPLICA_STATES = {ReplicaState.STARTING, ReplicaState.READY, ReplicaState.UNHEALTHY}
DONE_REPLICA_STATES = {ReplicaState.STOPPED, ReplicaState.FAILED}


class EventKind(models.TextChoices):
    DEPLOYED = "DEPLOYED"
    REPLICA_STARTED = "REPLICA_STARTED"
    REPLICA_READY = "REPLICA_READY"
    REPLICA_UNHEALTHY = "REPLICA_UNHEALTHY"
    REPLICA_FAILED = "REPLICA_FAILED"
    REPLICA_STOPPED = "REPLICA_STOPPED"
    SCALED = "SCALED"
    FAILED = "FAILED"
    DELETING = "DELETING"
