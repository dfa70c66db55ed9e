"""Compute Engine errors sorted into what a user can act on.

Quota, stockout and permission errors are permanent for this attempt: the Operation
fails with a message saying what to do. Rate limits, 5xx and dropped connections are
transient: the client retries them with backoff."""

from __future__ import annotations

from google.api_core import exceptions as gexc

from ..base import ProviderError

STOCKOUT_CODES = {
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "RESOURCE_POOL_EXHAUSTED",
}
QUOTA_CODES = {"QUOTA_EXCEEDED", "quotaExceeded"}
PERMISSION_CODES = {
    "PERMISSION_DENIED",
    "forbidden",
    "insufficientPermissions",
    "accessNotConfigured",
}
TRANSIENT_CODES = {
    "RESOURCE_OPERATION_RATE_EXCEEDED",
    "rateLimitExceeded",
    "userRateLimitExceeded",
    "INTERNAL_ERROR",
    "backendError",
    "SERVICE_UNAVAILABLE",
}
TRANSIENT_HTTP = (
    gexc.TooManyRequests,
    gexc.InternalServerError,
    gexc.BadGateway,
    gexc.ServiceUnavailable,
    gexc.GatewayTimeout,
    gexc.RetryError,
)


class Transient(Exception):
    """Worth another try after a pause."""


def error_for(code: str, message: str, *, where: str) -> ProviderError:
    """A ProviderError for one Compute Engine error code (from an Operation or HTTP)."""
    if code in STOCKOUT_CODES:
        return ProviderError(
            f"{where}: Compute Engine has no capacity for this machine type in the zone "
            f"right now ({code}: {message}). Retry later, use a reservation, or pick "
            "another zone.",
            code="STOCKOUT",
            permanent=True,
        )
    if code in QUOTA_CODES:
        return ProviderError(
            f"{where}: quota exceeded ({message}). Ask for more quota in the Cloud console "
            "(IAM & Admin > Quotas) or make the cluster smaller.",
            code="QUOTA_EXCEEDED",
            permanent=True,
        )
    if code in PERMISSION_CODES:
        return ProviderError(
            f"{where}: permission denied ({message}). The account mtc runs as needs the "
            "roles listed in README (Compute Admin, Service Account User).",
            code="PERMISSION_DENIED",
            permanent=True,
        )
    return ProviderError(f"{where}: {code}: {message}", code="GCE_ERROR", permanent=True)


def _first_reason(exc: gexc.GoogleAPICallError) -> tuple[str, str]:
    for err in getattr(exc, "errors", None) or []:
        if isinstance(err, dict) and err.get("reason"):
            return err["reason"], err.get("message", "")
    return "", ""


def from_http(exc: Exception, *, where: str) -> Exception:
    """Classify an exception raised by a client call: Transient or ProviderError."""
    if isinstance(exc, TRANSIENT_HTTP) or isinstance(exc, (ConnectionError, TimeoutError)):
        return Transient(f"{where}: {exc}")
    if not isinstance(exc, gexc.GoogleAPICallError):
        if type(exc).__module__.startswith(("requests", "urllib3")):
            return Transient(f"{where}: {exc}")
        return exc
    reason, detail = _first_reason(exc)
    if isinstance(exc, gexc.NotFound):
        return ProviderError(f"{where}: {exc.message}", code="NOT_FOUND", permanent=True)
    if isinstance(exc, gexc.Conflict) and reason in ("alreadyExists", ""):
        return ProviderError(f"{where}: {exc.message}", code="ALREADY_EXISTS", permanent=True)
    if reason in TRANSIENT_CODES:
        return Transient(f"{where}: {exc.message}")
    if "quota" in (exc.message or "").lower() and exc.code == 403:
        reason = reason or "QUOTA_EXCEEDED"
    if isinstance(exc, gexc.Forbidden) and reason not in QUOTA_CODES:
        reason = reason or "PERMISSION_DENIED"
    return error_for(reason or type(exc).__name__, exc.message or detail, where=where)
