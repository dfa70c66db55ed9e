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
