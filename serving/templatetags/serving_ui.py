"""Colours for endpoint and replica states (the same tones the other pages use)."""

from django import template

register = template.Library()

ENDPOINT_TONES = {
    "READY": "ok",
    "DEPLOYING": "info",
    "DEGRADED": "warn",
    "FAILED": "bad",
    "DELETING": "muted",
}
REPLICA_TONES = {
    "READY": "ok",
    "STARTING": "info",
    "UNHEALTHY": "warn",
    "STOPPING": "muted",
    "STOPPED": "muted",
    "FAILED": "bad",
}


@register.filter
def endpoint_tone(state: str) -> str:
    return ENDPOINT_TONES.get(state, "muted")


@register.filter
def replica_tone(state: str) -> str:
    return REPLICA_TONES.get(state, "muted")


@register.filter
def ms(value) -> str:
    """12.345 -> '12.3 ms'; None -> '—'."""
    if value is None:
        return "—"
    return f"{value:,.0f} ms" if value >= 100 else f"{value:.1f} ms"
