"""Serving's settings, each overridable in Django settings (``MTC_SERVING_*``)."""

from __future__ import annotations

from django.conf import settings


def setting(name: str, default):
    return getattr(settings, f"MTC_SERVING_{name}", default)


def request_timeout_s() -> float:
    """How long mtc waits for a replica's answer to one request."""
    return float(setting("REQUEST_TIMEOUT_S", 120.0))


def health_timeout_s() -> float:
    return float(setting("HEALTH_TIMEOUT_S", 2.0))


def start_timeout_s() -> float:
    """A running replica job that has not answered /health by then is replaced."""
    return float(setting("START_TIMEOUT_S", 300.0))


def unhealthy_grace_s() -> float:
    """A replica unhealthy this long (its job still running) is replaced."""
    return float(setting("UNHEALTHY_GRACE_S", 30.0))


def max_failed_starts() -> int:
    """Replicas that die before answering, in a row, before the endpoint is FAILED."""
    return int(setting("MAX_FAILED_STARTS", 5))


def max_replicas_limit() -> int:
    return int(setting("MAX_REPLICAS", 16))


def request_retention_s() -> float | None:
    """How long the per-request records behind the figures are kept; None: forever
    (MTC_RETENTION_ENDPOINT_REQUESTS_DAYS, README "Retention")."""
    days = float(getattr(settings, "MTC_RETENTION_ENDPOINT_REQUESTS_DAYS", 1) or 0)
    return days * 86400 if days > 0 else None


def replica_threads() -> int:
    """OMP/torch threads per CPU replica (the local host has few cores)."""
    return int(setting("REPLICA_THREADS", 1))
