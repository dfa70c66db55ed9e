"""Template helpers for the cluster pages: colours for Slurm, cluster and
Operation states (one mapping, used by every page and the node grids)."""

from __future__ import annotations

from django import template

register = template.Library()

# Node tile colour groups, by Slurm's display state (sinfo %T, upper-cased).
NODE_GROUPS = ("idle", "busy", "drain", "down", "unknown")
NODE_GROUP_LABELS = {
    "idle": "Idle",
    "busy": "Allocated / mixed",
    "drain": "Draining / drained",
    "down": "Down / not responding",
    "unknown": "Unknown",
}


def node_group(state: str) -> str:
    """IDLE -> idle, ALLOCATED/MIXED/COMPLETING -> busy, DRAIN* -> drain,
    DOWN/FAIL/not responding (*) -> down, anything else -> unknown."""
    state = (state or "").upper()
    if state.endswith("*") or "DOWN" in state or "FAIL" in state:
        return "down"
    if "DRAIN" in state:
        return "drain"
    if state.startswith("IDLE"):
        return "idle"
    if state.startswith(("ALLOC", "MIX", "COMPLETING")):
        return "busy"
    return "unknown"


CLUSTER_TONES = {
    "RUNNING": "ok",
    "CREATING": "info",
    "UPDATING": "info",
    "DEGRADED": "warn",
    "ERROR": "bad",
    "DELETING": "muted",
}
OPERATION_TONES = {
    "PENDING": "muted",
    "RUNNING": "info",
    "SUCCEEDED": "ok",
    "FAILED": "bad",
}


@register.filter
def node_tone(state: str) -> str:
    return node_group(state)


@register.filter
def cluster_tone(state: str) -> str:
    return CLUSTER_TONES.get(state, "muted")


@register.filter
def operation_tone(state: str) -> str:
    return OPERATION_TONES.get(state, "muted")


@register.filter
def gpu_label(gpu_type: str) -> str:
    """h200 -> H200 (the GRES type as people say it)."""
    return (gpu_type or "GPU").upper()


@register.filter
def humanize_kind(kind: str) -> str:
    """CREATE_CLUSTER -> Create cluster."""
    return (kind or "").replace("_", " ").capitalize()


# --- jobs -----------------------------------------------------------------------
# Slurm job states (squeue %T) -> badge tone: running blue, waiting amber, done
# green, failed red, stopped by someone grey.
JOB_TONES = {
    "PENDING": "warn",
    "REQUEUED": "warn",
    "REQUEUE_HOLD": "warn",
    "REQUEUE_FED": "warn",
    "SUSPENDED": "warn",
    "STOPPED": "warn",
    "CONFIGURING": "info",
    "RUNNING": "info",
    "COMPLETING": "info",
    "RESIZING": "info",
    "SIGNALING": "info",
    "STAGE_OUT": "info",
    "COMPLETED": "ok",
    "FAILED": "bad",
    "TIMEOUT": "bad",
    "NODE_FAIL": "bad",
    "BOOT_FAIL": "bad",
    "DEADLINE": "bad",
    "OUT_OF_MEMORY": "bad",
    "CANCELLED": "muted",
    "PREEMPTED": "muted",
    "REVOKED": "muted",
    "SPECIAL_EXIT": "muted",
    "UNKNOWN": "muted",
}


@register.filter
def job_tone(state: str) -> str:
    return JOB_TONES.get(state, "muted")


def slurm_duration(seconds: float) -> str:
    """Seconds as Slurm prints elapsed time: M:SS, H:MM:SS or D-HH:MM:SS."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


# States in which a job has not started (squeue's start time is then an estimate).
JOB_WAITING_STATES = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}


@register.filter
def job_started(job) -> bool:
    return bool(job.start_time) and job.state not in JOB_WAITING_STATES


@register.filter
def job_elapsed(job) -> str:
    """How long the job has run: start to end once it ended, start to now while it runs.
    (squeue's end time of a running job is its limit, so it is not used then.)"""
    from django.utils import timezone

    from jobs.choices import ACTIVE_STATES

    if not job_started(job):
        return ""
    if job.state in ACTIVE_STATES:
        end = timezone.now()
    elif job.end_time and job.end_time >= job.start_time:
        end = job.end_time
    else:
        return ""
    return slurm_duration((end - job.start_time).total_seconds())
