"""Slurm's job states, with the named groups the API and pages use."""

from django.db import models


class JobState(models.TextChoices):
    PENDING = "PENDING"  # queued, waiting for resources, a dependency or a hold
    CONFIGURING = "CONFIGURING"  # nodes allocated, being readied
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"  # finished, epilog and cleanup still running
    COMPLETED = "COMPLETED"  # exit code 0
    FAILED = "FAILED"  # non-zero exit code
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"  # ran past its time limit
    NODE_FAIL = "NODE_FAIL"  # a node it ran on failed
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    REQUEUED = "REQUEUED"  # being put back in the queue
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    RESIZING = "RESIZING"
    REVOKED = "REVOKED"
    SIGNALING = "SIGNALING"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    STAGE_OUT = "STAGE_OUT"
    STOPPED = "STOPPED"
    UNKNOWN = "UNKNOWN"  # left the queue before mtc saw how it ended


ACTIVE_STATES = {
    JobState.PENDING,
    JobState.CONFIGURING,
    JobState.RUNNING,
    JobState.SUSPENDED,
    JobState.COMPLETING,
    JobState.REQUEUED,
    JobState.REQUEUE_HOLD,
    JobState.REQUEUE_FED,
    JobState.RESIZING,
    JobState.SIGNALING,
    JobState.STAGE_OUT,
    JobState.STOPPED,
}
TERMINAL_STATES = {
    JobState.COMPLETED,
    JobState.FAILED,
    JobState.CANCELLED,
    JobState.TIMEOUT,
    JobState.NODE_FAIL,
    JobState.PREEMPTED,
    JobState.BOOT_FAIL,
    JobState.DEADLINE,
    JobState.OUT_OF_MEMORY,
    JobState.REVOKED,
    JobState.SPECIAL_EXIT,
    JobState.UNKNOWN,
}
CAN_CANCEL = ACTIVE_STATES - {JobState.COMPLETING}
# Slurm requeues running, suspended or finished batch jobs.
CAN_REQUEUE = {
    JobState.RUNNING,
    JobState.SUSPENDED,
    JobState.COMPLETED,
    JobState.FAILED,
    JobState.CANCELLED,
    JobState.TIMEOUT,
    JobState.NODE_FAIL,
    JobState.PREEMPTED,
    JobState.OUT_OF_MEMORY,
}
CAN_HOLD = {JobState.PENDING}
HELD_REASONS = {"JobHeldUser", "JobHeldAdmin"}

# How mtc's own requeues (health.repair, recipes.hang, recipes.straggler) start the cause
# of the job event they record: a requeue mtc made, and started again itself.
INTERRUPTED = "interrupted:"
