"""The OpenAPI schema's conventions (drf-spectacular): one Error component every error
status points at, a tag per resource, operation ids like ``jobs_submit``, and the error
statuses each operation can answer added from what it takes (a body, parameters, auth)."""

from __future__ import annotations

import re
from typing import Any

from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers
from rest_framework.permissions import AllowAny, IsAuthenticated


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField(help_text="INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, ...")
    message = serializers.CharField()
    fields = serializers.DictField(
        child=serializers.CharField(),
        help_text="Per bad field (a name or a JSON path such as node_pools[0].id): why",
    )


class ErrorSerializer(serializers.Serializer):
    """Every error the API answers: {"error": {"code", "message", "fields"}}."""

    error = ErrorDetailSerializer()


ERROR_MEANINGS = {
    400: "Invalid request: `fields` names each bad field",
    401: "No credentials, or not valid ones",
    403: "Not allowed (operators only, no CSRF token, no POSIX account to run as)",
    404: "No such resource (or not one you can see)",
    409: "Conflicts with the resource's state",
    413: "Request body too large",
    415: "Request bodies are JSON (application/json)",
    503: "A dependency (the task queue, Slurm, a replica) is not answering; try again",
}


def errors(*statuses: int) -> dict[int, OpenApiResponse]:
    """Error responses for @extend_schema(responses=...), each with the Error shape."""
    return {s: OpenApiResponse(ErrorSerializer, description=ERROR_MEANINGS[s]) for s in statuses}


# Tags: the path's first resource, but under /clusters/{id}/ the last one it names:
# /clusters/{id}/jobs/{job_id}/cancel is a jobs operation, .../nodes/{node}/health a health
# one, /endpoints/{id}/models an endpoints one.
RESOURCE_SEGMENTS = {
    "clusters": "clusters",
    "operations": "operations",
    "nodes": "nodes",
    "jobs": "jobs",
    "health": "health",
    "faults": "health",
    "repair": "repairs",
    "repairs": "repairs",
    "recipes": "recipes",
    "models": "models",
    "endpoints": "endpoints",
    "tokens": "tokens",
    "accounts": "accounts",
    "me": "identity",
}
ACTION_NAMES = {"partial_update": "update", "destroy": "delete"}
UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}


class AutoSchema(SpectacularAutoSchema):
    def get_tags(self) -> list[str]:
        segments = [s for s in self._tokenize_path() if s in RESOURCE_SEGMENTS]
        if not segments:
            return super().get_tags()
        return [RESOURCE_SEGMENTS[segments[-1] if segments[0] == "clusters" else segments[0]]]

    def get_operation_id(self) -> str:
        # ViewSets name their actions (list, retrieve, create, retry); other views say
        # theirs with @extend_schema(operation_id=...), else the method's usual action.
        # A view serving several actions (jobs' cancel, hold, ...) names its own.
        action = getattr(self.view, "action", None) or getattr(self.view, "action_name", None)
        if not action:
            if self.method == "GET" and self._is_list_view():
                action = "list"
            else:
                action = self.method_mapping[self.method.lower()]
        return f"{self.get_tags()[0]}_{ACTION_NAMES.get(action, action)}"

    def _authenticated(self) -> bool:
        permissions = self.view.get_permissions()
        return bool(self.view.get_authenticators()) and not any(
            isinstance(p, AllowAny) for p in permissions
        )

    def error_statuses(self) -> set[int]:
        """What any operation of this shape can answer besides its own declared errors."""
        statuses: set[int] = set()
        if self._authenticated():
            statuses.add(401)
            beyond_signed_in = any(
                type(p) is not IsAuthenticated for p in self.view.get_permissions()
            )
            # Unsafe methods: a session without a CSRF token is refused too.
            if self.method in UNSAFE or beyond_signed_in:
                statuses.add(403)
        if self.method in ("POST", "PUT", "PATCH") and self.get_request_serializer() is not None:
            statuses |= {400, 415}
        parameters = self._get_parameters()
        if any(p.get("in") == "query" for p in parameters):
            statuses.add(400)
        if any(p.get("in") == "path" for p in parameters) or self._paginated():
            statuses.add(404)  # a page past the last is a 404 too
        return statuses

    def _get_filter_parameters(self) -> list:
        # A choice filter also takes "": django-filter reads an empty value as no filter.
        parameters = super()._get_filter_parameters()
        for parameter in parameters:
            schema = parameter.get("schema", {})
            schema = schema.get("items", schema)
            if "enum" in schema and "" not in schema["enum"]:
                schema["enum"] = [*schema["enum"], ""]
        return parameters

    def _paginated(self) -> bool:
        return self.method == "GET" and self._is_list_view() and self._get_paginator() is not None

    def _get_response_bodies(self, direction: Any = "response") -> dict:
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        for code, response in errors(*sorted(self.error_statuses())).items():
            if str(code) not in responses:
                responses[str(code)] = self._get_response_for_code(
                    response, str(code), direction=direction
                )
        return dict(sorted(responses.items()))


def api_only(endpoints: list, **kwargs) -> list:
    """PREPROCESSING_HOOKS: the schema is the API's (/metrics is Prometheus's)."""
    return [e for e in endpoints if e[0].startswith("/api/v1/")]


TRAILING = re.compile(r"(?<=.)/$")


def documented_paths(result: dict, **kwargs) -> dict:
    """POSTPROCESSING_HOOKS: paths as documented, without the trailing slash the routes
    also accept (`/?$` reads as `/` to drf-spectacular)."""
    result["paths"] = {TRAILING.sub("", path): item for path, item in result["paths"].items()}
    return result
