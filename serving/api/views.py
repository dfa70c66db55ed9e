"""Endpoints API: deploy, list, get, delete, request figures, the authenticated
completions route that forwards to a healthy replica (whole or streamed), and the
OpenAI-shaped model list."""

from __future__ import annotations

from contextlib import contextmanager

from django.http import HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response

from mtc.api.errors import ApiError
from mtc.api.schema import errors
from mtc.numbers import is_whole_number

from .. import selectors, services
from ..deploy import DeployError, endpoint_validate
from ..models import Endpoint
from ..routing import RouteError, completion_route
from ..streaming import completion_stream_route
from .serializers import (
    CompletionRequestSerializer,
    CompletionResponseSerializer,
    EndpointCreateSerializer,
    EndpointDetailSerializer,
    EndpointSerializer,
    OpenAIModelListSerializer,
    OpenAIModelSerializer,
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
        if getattr(self, "swagger_fake_view", False):  # the schema: no user to filter by
            return Endpoint.objects.none()
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

    @extend_schema(operation_id="endpoints_list", responses=EndpointSerializer(many=True))
    def get(self, request):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(EndpointSerializer(page, many=True).data)

    @extend_schema(
        operation_id="endpoints_create",
        request=EndpointCreateSerializer,
        responses={201: EndpointDetailSerializer, **errors(503)},
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

    @extend_schema(operation_id="endpoints_retrieve")
    def get(self, request, endpoint_id):
        return Response(self.detail(self.endpoint()))

    @extend_schema(
        operation_id="endpoints_delete",
        request=None,
        responses={202: EndpointSerializer, 204: None, **errors(503)},
        description="202 while its replicas stop (the endpoint is DELETING); 204 once gone.",
    )
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

    @extend_schema(
        operation_id="endpoints_metrics",
        parameters=[
            OpenApiParameter(
                "window",
                {"type": "integer", "minimum": 60, "maximum": 86400},
                description="Seconds (default 900)",
            )
        ],
    )
    def get(self, request, endpoint_id):
        raw = request.query_params.get("window", "900")
        if not is_whole_number(raw) or not 60 <= int(raw) <= 86400:
            raise ApiError(
                code="INVALID_ARGUMENT",
                message="window must be whole seconds from 60 to 86400.",
                fields={"window": "Must be whole seconds from 60 to 86400."},
            )
        return Response(selectors.endpoint_series(self.endpoint(), window_s=int(raw)))


class EndpointCompletionsView(EndpointMixin, GenericAPIView):
    serializer_class = CompletionRequestSerializer
    chat = False
    action_name = "completions"  # the schema's operation id: endpoints_completions

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
        responses={200: CompletionResponseSerializer, **errors(503)},
        description="OpenAI-style completion, answered by one of the endpoint's healthy "
        "replicas (the answer is the replica's, as it is; X-MTC-Replica names it). On "
        "/completions a body with 'messages' is a chat completion. With \"stream\": true "
        "the answer is server-sent events (text/event-stream: 'data: {chunk}' per token "
        "batch, then 'data: [DONE]'); a failure midway is a last 'data: {\"error\": ...}'. "
        "503 when no replica is healthy.",
    )
    def post(self, request, endpoint_id):
        endpoint = self.endpoint()
        body = request.data
        chat = self.chat or (isinstance(body, dict) and "messages" in body and "prompt" not in body)
        stream = isinstance(body, dict) and body.get("stream") is True
        try:
            if stream:
                streamed = completion_stream_route(endpoint=endpoint, body=body, chat=chat)
            else:
                routed = completion_route(endpoint=endpoint, body=body, chat=chat)
        except RouteError as exc:
            raise ApiError(
                code=exc.code, message=exc.message, status_code=exc.status, fields=exc.fields
            ) from exc
        if stream:
            response = StreamingHttpResponse(streamed.events, content_type="text/event-stream")
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"  # a proxy in front must not hold tokens back
            response["X-MTC-Replica"] = str(streamed.replica_number)
            return response
        response = HttpResponse(routed.body, content_type="application/json")
        response["X-MTC-Replica"] = str(routed.replica_number)
        return response


class EndpointModelsView(EndpointMixin, GenericAPIView):
    """OpenAI's GET /models (and /models/{id}) for the one model an endpoint serves,
    so OpenAI clients pointed at the endpoint can list it."""

    serializer_class = OpenAIModelListSerializer

    def get_queryset(self):
        qs = Endpoint.objects.select_related("version__model", "owner")
        return qs if self.request.user.is_staff else qs.filter(owner=self.request.user)

    @extend_schema(operation_id="endpoints_models_list", responses={200: OpenAIModelListSerializer})
    def get(self, request, endpoint_id):
        return Response({"object": "list", "data": selectors.openai_models(self.endpoint())})


class EndpointModelView(EndpointModelsView):
    serializer_class = OpenAIModelSerializer

    @extend_schema(operation_id="endpoints_models_retrieve", responses={200: OpenAIModelSerializer})
    def get(self, request, endpoint_id, model_id):
        endpoint = self.endpoint()
        for model in selectors.openai_models(endpoint):
            if model["id"] == model_id:
                return Response(model)
        raise ApiError(
            code="NOT_FOUND",
            message=f"Endpoint {endpoint.pk} serves {endpoint.served_model}, not {model_id}.",
            status_code=status.HTTP_404_NOT_FOUND,
        )
