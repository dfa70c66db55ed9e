from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from mtc.api.errors import ApiError
from mtc.api.pagination import StandardPagination
from mtc.api.schema import errors

from .. import selectors, services
from ..models import Cluster, Node, Operation
from ..spec import SpecError
from .permissions import IsOperatorOrReadOnly
from .serializers import (
    ClusterPatchSerializer,
    ClusterSerializer,
    ClusterSpecSerializer,
    NodeSerializer,
    OperationSerializer,
)


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


# The schema's example spec: a login node and one node of 8 emulated GPUs, local Slurm.
EXAMPLE_SPEC = {
    "cluster_id": "example",
    "display_name": "Example cluster",
    "provider": "local",
    "labels": {"team": "llm"},
    "node_pools": [
        {
            "id": "login",
            "machine_spec": {"machine_type": "local-1"},
            "scaling_spec": {"min_node_count": 1, "max_node_count": 1},
        },
        {
            "id": "gpu",
            "machine_spec": {
                "machine_type": "local-2",
                "accelerator_type": "NVIDIA_H200_141GB",
                "accelerator_count": 8,
            },
            "scaling_spec": {"min_node_count": 1, "max_node_count": 1},
        },
    ],
    "orchestrator_spec": {
        "slurm_spec": {
            "login_node_pool_id": "login",
            "partitions": [{"id": "gpu", "node_pool_ids": ["gpu"], "default": True}],
        }
    },
}


def _accepted(operation: Operation) -> Response:
    return Response(OperationSerializer(operation).data, status=status.HTTP_202_ACCEPTED)


class ClusterViewSet(viewsets.GenericViewSet):
    """Clusters (docs/api.md). Writes answer 202 with an Operation."""

    permission_classes = [IsAuthenticated, IsOperatorOrReadOnly]
    serializer_class = ClusterSerializer
    pagination_class = StandardPagination
    queryset = Cluster.objects.none()  # for the schema; requests use selectors
    lookup_field = "cluster_id"
    lookup_value_regex = r"[a-z][a-z0-9-]{0,30}"

    def _get(self, cluster_id: str) -> Cluster:
        return get_object_or_404(selectors.cluster_list(), cluster_id=cluster_id)

    def list(self, request):
        page = self.paginate_queryset(selectors.cluster_list())
        return self.get_paginated_response(ClusterSerializer(page, many=True).data)

    @extend_schema(responses=ClusterSerializer)
    def retrieve(self, request, cluster_id=None):
        return Response(ClusterSerializer(self._get(cluster_id)).data)

    @extend_schema(
        request=ClusterSpecSerializer,
        responses={202: OperationSerializer, **errors(409, 503)},
        examples=[OpenApiExample("local", value=EXAMPLE_SPEC, request_only=True)],
        description="Create a cluster from a spec (docs/spec.md). 400 names each bad field "
        "by its JSON path; 409 when the cluster_id (or a port) is taken.",
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
        request=ClusterPatchSerializer,
        responses={202: OperationSerializer, **errors(409, 503)},
        examples=[
            OpenApiExample(
                "resize",
                value={
                    "node_pools": [
                        {"id": "gpu", "scaling_spec": {"min_node_count": 2, "max_node_count": 2}}
                    ],
                    "labels": {"team": "llm"},
                },
                request_only=True,
            )
        ],
        description="Resize node pools (scaling_spec) and change labels; pools are matched "
        "by id and what is not named stays as it is. 409 while another operation runs.",
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
        responses={202: OperationSerializer, **errors(409, 503)},
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

    @extend_schema(
        responses={202: OperationSerializer, **errors(503)},
        description="Delete everything the cluster made; the Operation tracks it.",
    )
    def destroy(self, request, cluster_id=None):
        operation = services.cluster_delete(cluster=self._get(cluster_id), owner=request.user)
        return _accepted(operation)


class OperationViewSet(mixins.RetrieveModelMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    queryset = Operation.objects.all()
    # Only a UUID reaches the lookup (anything else is a 404, not a failed UUID cast).
    lookup_value_regex = r"[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}"
    serializer_class = OperationSerializer
    filterset_fields = ["state", "kind", "target"]


class NodeViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Nodes of one cluster, as the poller last stored them (never Slurm per request)."""

    serializer_class = NodeSerializer
    filterset_fields = ["slurm_state", "partition", "health"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema: no cluster to look up
            return Node.objects.none()
        cluster = get_object_or_404(Cluster, cluster_id=self.kwargs["cluster_id"])
        return selectors.cluster_nodes(cluster)
