"""Endpoints API: deploy, list, get, delete, request figures, and the authenticated
completions route that forwards to a healthy replica."""

from __future__ import annotations

from contextlib import contextmanager

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response

from mtc.api.errors import ApiError

from .. import selectors, services
from ..deploy import DeployError, endpoint_validate
from ..models import Endpoint
from ..routing import RouteError, completion_route
from .serializers import (
    CompletionRequestSerializer,
    CompletionResponseSerializer,
    EndpointCreateSerializer,
    EndpointDetailSerializer,
    EndpointSerializer,
    SeriesSerializer,
)


@contextmanager
def deploy_errors():
    try:
        yield
    except DeployError as exc:
        raise ApiError(
            code="INVALID_ARGUMENT", message=f"Invalid endpoint: {exc}", fields=exc.fields
        ) from exc


class EndpointMixin:
    def get_queryset(self):
        return selectors.endpoints_visible_to(self.request.user)

    def endpoint(self) -> Endpoint:
        return get_object_or_404(self.get_queryset(), pk=self.kwargs["endpoint_id"])

    def detail(self, endpoint: Endpoint) -> dict:
        context = {
            "figures": selectors.endpoint_figures(endpoint),
            "events": list(endpoint.events.all()[:20]),
        }
        return EndpointDetailSerializer(endpoint, context=context).data


class EndpointListView(EndpointMixin, GenericAPIView):
    serializer_class = EndpointSerializer

    def get(self, request):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(EndpointSerializer(page, many=True).data)

    @extend_schema(
        request=EndpointCreateSerializer,
        responses={201: EndpointDetailSerializer},
        description='Deploy a registered model version: {"model": "tiny", "version": 3 or '
        '"prod", "cluster": "demo", "min_replicas": 1, "max_replicas": 2}. Replicas run as '
        "Slurm jobs owned by the caller; the endpoint is READY once one answers.",
    )
    def post(self, request):
        with deploy_errors():
            plan = endpoint_validate(request.data)
        endpoint = services.endpoint_create(plan=plan, owner=request.user)
        endpoint = self.get_queryset().get(pk=endpoint.pk)
        return Response(self.detail(endpoint), status=status.HTTP_201_CREATED)


class EndpointDetailView(EndpointMixin, GenericAPIView):
    serializer_class = EndpointDetailSerializer

    def get(self, request, endpoint_id):
        return Response(self.detail(self.endpoint()))

    @extend_schema(request=None, responses={202: EndpointSerializer})
    def delete(self, request, endpoint_id):
        endpoint = services.endpoint_delete(endpoint=self.endpoint(), actor=request.user)
        if not Endpoint.objects.filter(pk=endpoint.pk).exists():
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response(
            EndpointSerializer(self.get_queryset().get(pk=endpoint.pk)).data,
            status=status.HTTP_202_ACCEPTED,
        )


class EndpointMetricsView(EndpointMixin, GenericAPIView):
    serializer_class = SeriesSerializer

    @extend_schema(parameters=[OpenApiParameter("window", int, description="Seconds, 60-86400")])
    def get(self, request, endpoint_id):
        raw = request.query_params.get("window", "900")
        if not raw.isdigit() or not 60 <= int(raw) <= 86400:
            raise ApiError(
                code="INVALID_ARGUMENT",
                message="window must be whole seconds from 60 to 86400.",
                fields={"window": "Must be whole seconds from 60 to 86400."},
            )
        return Response(selectors.endpoint_series(self.endpoint(), window_s=int(raw)))


class EndpointCompletionsView(EndpointMixin, GenericAPIView):
    serializer_class = CompletionRequestSerializer
    chat = False

    def get_queryset(self):
        # The hot path: just the fields routing needs.
        qs = Endpoint.objects.select_related("version__model").only(
            "id",
            "state",
            "status_message",
            "chat",
            "replica_token",
            "owner_id",
            "version__number",
            "version__model__name",
        )
        return qs if self.request.user.is_staff else qs.filter(owner=self.request.user)

    @extend_schema(
        request=CompletionRequestSerializer,
        responses={200: CompletionResponseSerializer},
        description="OpenAI-style completion, answered by one of the endpoint's healthy "
        "replicas (the answer is the replica's, as it is; X-MTC-Replica names it). On "
        "/completions a body with 'messages' is a chat completion. 503 when no replica "
        "is healthy.",
    )
    def post(self, request, endpoint_id):
        endpoint = self.endpoint()
        body = request.data
        chat = self.chat or (isinstance(body, dict) and "messages" in body and "prompt" not in body)
        try:
            routed = completion_route(endpoint=endpoint, body=body, chat=chat)
        except RouteError as exc:
            raise ApiError(
                code=exc.code, message=exc.message, status_code=exc.status, fields=exc.fields
            ) from exc
        response = HttpResponse(routed.body, content_type="application/json")
        response["X-MTC-Replica"] = str(routed.replica_number)
        return response
