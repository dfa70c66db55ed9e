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


@register.filter
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

    if not job.is_active and getattr(job, "elapsed_s", None) is not None:
        return slurm_duration(job.elapsed_s)  # accounting's own figure
    if not job_started(job):
        return ""
    if job.is_active:
        end = timezone.now()
    elif job.end_time and job.end_time >= job.start_time:
        end = job.end_time
    else:
        return ""
    return slurm_duration((end - job.start_time).total_seconds())


# --- node health and repairs ------------------------------------------------------
# Node health (health.choices.NodeHealth) -> tone: the tiles' badge and the node page.
HEALTH_TONES = {
    "HEALTHY": "ok",
    "WARNING": "warn",
    "FAILED": "bad",
    "REPAIRING": "info",
    "UNKNOWN": "muted",
}
REPAIR_TONES = {
    "PENDING_APPROVAL": "warn",
    "WAITING": "muted",
    "RUNNING": "info",
    "SUCCEEDED": "ok",
    "FAILED": "bad",
    "CANCELLED": "muted",
}
FAILURE_TONES = {"OPEN": "bad", "REPAIRING": "info", "RESOLVED": "ok"}
SEVERITY_TONES = {"critical": "bad", "warning": "warn"}
# A health check's status (the agent's pass/warn/fail/skip/error).
CHECK_TONES = {"pass": "ok", "warn": "warn", "fail": "bad", "error": "bad", "skip": "muted"}
# A Slurm node-state group -> badge tone (the tiles use the groups' own colours).
SLURM_GROUP_TONES = {"idle": "ok", "busy": "info", "drain": "warn", "down": "bad"}


@register.filter
def health_tone(health: str) -> str:
    return HEALTH_TONES.get((health or "").upper(), "muted")


@register.filter
def repair_tone(state: str) -> str:
    return REPAIR_TONES.get(state, "muted")


@register.filter
def failure_tone(failure) -> str:
    """An open warning is amber, an open critical failure red."""
    if failure.state == "OPEN" and failure.severity != "critical":
        return "warn"
    return FAILURE_TONES.get(failure.state, "muted")


@register.filter
def severity_tone(severity: str) -> str:
    return SEVERITY_TONES.get(severity, "muted")


@register.filter
def check_tone(status: str) -> str:
    return CHECK_TONES.get(status, "muted")


@register.filter
def slurm_tone(state: str) -> str:
    return SLURM_GROUP_TONES.get(node_group(state), "muted")


@register.filter
def humanize_state(state: str) -> str:
    """PENDING_APPROVAL -> pending approval."""
    return (state or "").replace("_", " ").lower()


def human_duration(seconds: float | None) -> str:
    """12 -> 12s, 75 -> 1m 15s, 3720 -> 1h 02m, 90000 -> 1d 1h."""
    if seconds is None:
        return ""
    total = max(0, int(round(seconds)))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


@register.filter
def duration(value) -> str:
    """A timedelta (or seconds) as 1m 15s."""
    if value is None or value == "":
        return ""
    seconds = value.total_seconds() if hasattr(value, "total_seconds") else float(value)
    return human_duration(seconds)


@register.filter
def ago(value) -> str:
    """A past time as 'just now', '12 min ago', '3h 05m ago'."""
    from django.utils import timezone

    if not value:
        return ""
    seconds = (timezone.now() - value).total_seconds()
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    return f"{human_duration(seconds)} ago"
