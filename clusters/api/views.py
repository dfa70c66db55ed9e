from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from mtc.api.errors import ApiError

from .. import selectors, services
from ..models import Cluster, Operation
from ..spec import SpecError
from .permissions import IsOperatorOrReadOnly
from .serializers import ClusterSerializer, NodeSerializer, OperationSerializer


def _spec_error(exc: SpecError) -> ApiError:
    return ApiError(
        code="INVALID_ARGUMENT", message=f"Invalid cluster spec: {exc}", fields=exc.fields
    )


def _conflict(exc: services.ClusterConflict) -> ApiError:
    return ApiError(
        code=exc.code,
        message=str(exc),
        status_code=status.HTTP_409_CONFLICT,
        fields={exc.field: str(exc)} if exc.field else None,
    )


def _accepted(operation: Operation) -> Response:
    return Response(OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)


class ClusterViewSet(viewsets.ViewSet):
    """Clusters (docs/api.md). Writes answer 202 with an Operation."""

    permission_classes = [IsAuthenticated, IsOperatorOrReadOnly]
    lookup_field = "cluster_id"
    lookup_value_regex = r"[a-z][a-z0-9-]{0,30}"

    def _get(self, cluster_id: str) -> Cluster:
        return get_object_or_404(selectors.cluster_list(), cluster_id=cluster_id)

    @extend_schema(responses=ClusterSerializer(many=True))
    def list(self, request):
        from mtc.api.pagination import StandardPagination

        paginator = StandardPagination()
        page = paginator.paginate_queryset(selectors.cluster_list(), request, view=self)
        return paginator.get_paginated_response(ClusterSerializer(page, many=True).data)

    @extend_schema(responses=ClusterSerializer)
    def retrieve(self, request, cluster_id=None):
        return Response(ClusterSerializer(self._get(cluster_id)).data)

    @extend_schema(
        request={"application/json": {"type": "object"}},
        responses={202: OperationSerializer, 400: OpenApiResponse(description="Invalid spec")},
        description="Create a cluster from a spec (docs/spec.md).",
    )
    def create(self, request):
        try:
            operation = services.cluster_create(spec=request.data, owner=request.user)
        except SpecError as exc:
            raise _spec_error(exc) from exc
        except services.ClusterConflict as exc:
            raise _conflict(exc) from exc
        return _accepted(operation)

    @extend_schema(
        request={"application/json": {"type": "object"}},
        responses={202: OperationSerializer},
        description="Resize node pools (scaling_spec) and change labels.",
    )
    def partial_update(self, request, cluster_id=None):
        cluster = self._get(cluster_id)
        try:
            operation = services.cluster_update(
                cluster=cluster, patch=request.data, owner=request.user
            )
        except SpecError as exc:
            raise _spec_error(exc) from exc
        except services.ClusterConflict as exc:
            raise _conflict(exc) from exc
        return _accepted(operation)

    @extend_schema(
        request=None,
        responses={202: OperationSerializer, 409: OpenApiResponse(description="Not in ERROR")},
        description="Reconcile a cluster in ERROR again (e.g. after a stockout cleared): "
        "what exists is kept, what is missing is created.",
    )
    @action(detail=True, methods=["post"])
    def retry(self, request, cluster_id=None):
        try:
            operation = services.cluster_retry(cluster=self._get(cluster_id), owner=request.user)
        except services.ClusterConflict as exc:
            raise _conflict(exc) from exc
        return _accepted(operation)

    @extend_schema(responses={202: OperationSerializer})
    def destroy(self, request, cluster_id=None):
        operation = services.cluster_delete(cluster=self._get(cluster_id), owner=request.user)
        return _accepted(operation)


class OperationViewSet(mixins.RetrieveModelMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    queryset = Operation.objects.all()
    serializer_class = OperationSerializer
    filterset_fields = ["state", "kind", "target"]


class NodeViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Nodes of one cluster, as the poller last stored them (never Slurm per request)."""

    serializer_class = NodeSerializer
    filterset_fields = ["slurm_state", "partition", "health"]

    def get_queryset(self):
        cluster = get_object_or_404(Cluster, cluster_id=self.kwargs["cluster_id"])
        return selectors.cluster_nodes(cluster)
