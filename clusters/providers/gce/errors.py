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


# Compute Engine answers a reservation that cannot be used with generic codes
# (INVALID, CONDITION_NOT_MET, RESOURCE_NOT_FOUND, 429): the message tells which case.
RESERVATION_MISMATCH_TEXT = (
    "could not find the given reservation",
    "specified reservation",
    "must use reservationaffinity",
    "reservation must exist in the same project",
    "incompatible aggregatereservation",
    "requires reservation to be in ready state",
    "does not match the reservation",
    "specificreservationrequired",
)
RESERVATION_FULL_TEXT = (
    "reservation does not have enough resources",
    "insufficient capacity in the reservation",
    "reservation is insufficient",
    "is insufficient for",
)


def reservation_error(code: str, message: str, *, where: str) -> ProviderError | None:
    text = message.lower()
    if "reservation" not in text:
        return None
    if any(part in text for part in RESERVATION_FULL_TEXT):
        return ProviderError(
            f"{where}: the reservation has no room left for these nodes ({code}: {message}). "
            "Free VMs in it, ask for a larger reservation, or make the pool smaller.",
            code="RESERVATION_EXHAUSTED",
            permanent=True,
        )
    if any(part in text for part in RESERVATION_MISMATCH_TEXT):
        return ProviderError(
            f"{where}: the reservation cannot be used for this pool ({code}: {message}). "
            "Check its name, zone, project and state, and that its machine type, GPUs and "
            "disks are the pool's (a reservation consumed by name needs "
            "specificReservationRequired).",
            code="RESERVATION_MISMATCH",
            permanent=True,
        )
    return None


def error_for(code: str, message: str, *, where: str) -> ProviderError:
    """A ProviderError for one Compute Engine error code (from an Operation or HTTP)."""
    reservation = reservation_error(code, message, where=where)
    if reservation is not None:
        return reservation
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
    if not isinstance(exc, gexc.GoogleAPICallError):
        if isinstance(exc, TRANSIENT_HTTP) or isinstance(exc, (ConnectionError, TimeoutError)):
            return Transient(f"{where}: {exc}")
        if type(exc).__module__.startswith(("requests", "urllib3")):
            return Transient(f"{where}: {exc}")
        return exc
    reason, detail = _first_reason(exc)
    # Before the status: a full reservation answers 429, which no retry will mend.
    code, message = reason or type(exc).__name__, exc.message or detail or ""
    found = reservation_error(code, message, where=where)
    if found is not None:
        return found
    if isinstance(exc, TRANSIENT_HTTP):
        return Transient(f"{where}: {exc}")
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
