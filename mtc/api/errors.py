"""One error shape for the whole API: {"error": {"code", "message", "fields"}}."""

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import Http404, JsonResponse
from django.shortcuts import render
from django.views import csrf as csrf_views
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from mtc.queue import QueueUnavailable

log = logging.getLogger(__name__)


class ApiError(exceptions.APIException):
    """An error with an explicit code, status and optional per-field messages."""

    def __init__(
        self,
        *,
        code: str,
        message: str,
        status_code: int = status.HTTP_400_BAD_REQUEST,
        fields: dict[str, Any] | None = None,
    ):
        super().__init__(detail=message, code=code)
        self.status_code = status_code
        self.error_code = code
        self.message = message
        self.fields = fields or {}


def _flatten(detail: Any, prefix: str = "") -> dict[str, str]:
    """DRF's nested error dicts become {"a.b[0].c": "message"}."""
    out: dict[str, str] = {}
    if isinstance(detail, dict):
        for key, value in detail.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            out.update(_flatten(value, path))
    elif isinstance(detail, list):
        if all(not isinstance(item, (dict, list)) for item in detail):
            out[prefix or "non_field_errors"] = " ".join(str(item) for item in detail)
        else:
            for index, item in enumerate(detail):
                out.update(_flatten(item, f"{prefix}[{index}]"))
    else:
        out[prefix or "non_field_errors"] = str(detail)
    return out


INTERNAL = ("INTERNAL", "The server failed on this request; the error is logged.")


def _refused_request(exc: Exception) -> tuple[str, str, int] | None:
    """(code, message, status) for a request Django refuses to read: a body over
    DATA_UPLOAD_MAX_MEMORY_SIZE is 413, other refusals (too many fields) 400."""
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return "PAYLOAD_TOO_LARGE", f"The request body is over the limit of {limit} bytes.", 413
    if isinstance(exc, SuspiciousOperation):
        return "INVALID_ARGUMENT", f"The request was refused: {exc}", 400
    return None


def api_error_response(code: str, message: str, *, status: int) -> JsonResponse:
    return JsonResponse(error_body(code, message), status=status)


def csrf_failure(request, reason: str = ""):
    """CSRF_FAILURE_VIEW: the API answers in its own shape; pages keep Django's page."""
    if request.path.startswith("/api/"):
        return api_error_response(
            "PERMISSION_DENIED",
            f"CSRF check failed ({reason}); send a token instead.",
            status=403,
        )
    return csrf_views.csrf_failure(request, reason=reason)


class ApiErrorMiddleware:
    """Views under /api/ that are not DRF's (the inference proxy, the 404 catch-all)
    fail with the JSON error shape too, never Django's HTML 500 page."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, QueueUnavailable):  # pages too: say so, keep serving
            if request.path.startswith("/api/"):
                return api_error_response("UNAVAILABLE", str(exception), status=503)
            return render(request, "503.html", {"message": str(exception)}, status=503)
        if not request.path.startswith("/api/") or isinstance(exception, Http404):
            return None
        if refused := _refused_request(exception):
            code, message, status = refused
            return api_error_response(code, message, status=status)
        log.exception("API %s %s failed", request.method, request.path)
        return api_error_response(*INTERNAL, status=500)


def error_body(code: str, message: str, fields: dict[str, Any] | None = None) -> dict:
    return {"error": {"code": code, "message": message, "fields": fields or {}}}


def exception_handler(exc, context):
    if isinstance(exc, ApiError):
        return Response(error_body(exc.error_code, exc.message, exc.fields), status=exc.status_code)
    if isinstance(exc, QueueUnavailable):
        return Response(error_body("UNAVAILABLE", str(exc)), status=503)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    if refused := _refused_request(exc):
        code, message, status = refused
        return Response(error_body(code, message), status=status)
    response = drf_exception_handler(exc, context)
    if response is None:  # a bug, not the client's fault: still the API's error shape
        request = context.get("request")
        log.exception(
            "API %s %s failed", getattr(request, "method", "?"), getattr(request, "path", "?")
        )
        set_rollback()
        return Response(error_body(*INTERNAL), status=500)
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        message = "Invalid request: " + "; ".join(f"{k}: {v}" for k, v in fields.items())
        response.data = error_body("INVALID_ARGUMENT", message, fields)
    else:
        code = {
            401: "UNAUTHENTICATED",
            403: "PERMISSION_DENIED",
            404: "NOT_FOUND",
            405: "METHOD_NOT_ALLOWED",
            409: "CONFLICT",
            429: "RESOURCE_EXHAUSTED",
        }.get(response.status_code, getattr(exc, "default_code", "ERROR").upper())
        detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
        response.data = error_body(code, str(detail))
    return response
