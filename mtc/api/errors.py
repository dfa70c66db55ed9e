"""One error shape for the whole API: {"error": {"code", "message", "fields"}}."""

from typing import Any

from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


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


def error_body(code: str, message: str, fields: dict[str, Any] | None = None) -> dict:
    return {"error": {"code": code, "message": message, "fields": fields or {}}}


def exception_handler(exc, context):
    if isinstance(exc, ApiError):
        return Response(error_body(exc.error_code, exc.message, exc.fields), status=exc.status_code)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
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
        }.get(response.status_code, getattr(exc, "default_code", "ERROR").upper())
        detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
        response.data = error_body(code, str(detail))
    return response
