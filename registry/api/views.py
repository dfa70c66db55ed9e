"""/api/v1/models: the model registry (list, register, aliases, delete)."""

from __future__ import annotations

from contextlib import contextmanager

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response

from clusters.models import Cluster
from jobs import selectors as job_selectors
from mtc.api.errors import ApiError
from mtc.api.schema import errors

from .. import selectors, services
from ..models import Model
from .serializers import (
    AliasSerializer,
    ModelCreateSerializer,
    ModelDetailSerializer,
    ModelSerializer,
    VersionCreateSerializer,
    VersionSerializer,
)

RECENT_VERSIONS = 20  # in a model's detail; the rest through /versions


@contextmanager
def registry_errors():
    """The API's answer to what the registry's services raise."""
    try:
        yield
    except services.RegistryError as exc:
        raise ApiError(code="INVALID_ARGUMENT", message=str(exc), fields=exc.fields) from exc
    except services.RegistryConflict as exc:
        raise ApiError(
            code=exc.code, message=str(exc), status_code=status.HTTP_409_CONFLICT
        ) from exc


def _model(name: str) -> Model:
    return get_object_or_404(selectors.models_for_list(), name=name)


class ModelListView(GenericAPIView):
    serializer_class = ModelSerializer
    queryset = Model.objects.none()

    @extend_schema(
        operation_id="models_list",
        parameters=[OpenApiParameter("q", str, description="Part of the name")],
        responses={200: ModelSerializer(many=True)},
    )
    def get(self, request):
        qs = selectors.models_for_list(query=request.query_params.get("q", ""))
        page = self.paginate_queryset(qs)
        return self.get_paginated_response(ModelSerializer(page, many=True).data)

    @extend_schema(
        operation_id="models_create",
        request=ModelCreateSerializer,
        responses={201: ModelSerializer, **errors(409)},
    )
    def post(self, request):
        body = ModelCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        with registry_errors():
            model = services.model_create(
                name=body.validated_data["name"],
                description=body.validated_data.get("description", ""),
                owner=request.user,
            )
        return Response(ModelSerializer(_model(model.name)).data, status=status.HTTP_201_CREATED)


class ModelDetailView(GenericAPIView):
    serializer_class = ModelDetailSerializer
    queryset = Model.objects.none()

    @extend_schema(operation_id="models_retrieve")
    def get(self, request, name):
        model = _model(name)
        recent = selectors.versions_of(model).order_by("-number")[:RECENT_VERSIONS]
        model.recent_versions = list(recent)
        return Response(ModelDetailSerializer(model).data)


class VersionListView(GenericAPIView):
    serializer_class = VersionSerializer
    queryset = Model.objects.none()

    @extend_schema(
        operation_id="models_versions_list", responses={200: VersionSerializer(many=True)}
    )
    def get(self, request, name):
        model = _model(name)
        page = self.paginate_queryset(selectors.versions_of(model).order_by("-number"))
        return self.get_paginated_response(VersionSerializer(page, many=True).data)

    @extend_schema(
        operation_id="models_versions_register",
        request=VersionCreateSerializer,
        responses={201: VersionSerializer, **errors(409)},
        description="Register a COMPLETED recipe job's final checkpoint as the model's next "
        "version (the model is created, owned by you, if it does not exist). The version "
        "is PENDING while its export (save_pretrained, safetensors) runs, then READY.",
    )
    def post(self, request, name):
        body = VersionCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        cluster = Cluster.objects.filter(cluster_id=body.validated_data["cluster_id"]).first()
        job = None
        if cluster is not None:
            visible = job_selectors.jobs_visible_to(request.user, cluster).select_related("cluster")
            job = visible.filter(job_id=body.validated_data["job_id"]).first()
        if job is None:
            field = "cluster_id" if cluster is None else "job_id"
            raise ApiError(
                code="INVALID_ARGUMENT",
                message="No such job.",
                fields={field: f"No {field.removesuffix('_id')} by that id that you can see."},
            )
        with registry_errors():
            version = services.version_register(job=job, model_name=name, created_by=request.user)
        version = selectors.versions_of(version.model).get(pk=version.pk)
        return Response(VersionSerializer(version).data, status=status.HTTP_201_CREATED)


class VersionDetailView(GenericAPIView):
    serializer_class = VersionSerializer
    queryset = Model.objects.none()

    def _version(self, name: str, number: int):
        return get_object_or_404(selectors.versions_of(_model(name)), number=number)

    @extend_schema(operation_id="models_versions_retrieve")
    def get(self, request, name, number):
        return Response(VersionSerializer(self._version(name, number)).data)

    @extend_schema(
        operation_id="models_versions_delete",
        responses={204: None, **errors(409)},
        description="Delete the version and its export. 409 while an endpoint serves it.",
    )
    def delete(self, request, name, number):
        version = self._version(name, number)
        with registry_errors():
            services.version_delete(version=version, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class AliasView(GenericAPIView):
    serializer_class = AliasSerializer
    queryset = Model.objects.none()

    @extend_schema(
        operation_id="models_alias_set",
        request=AliasSerializer,
        responses={200: AliasSerializer, **errors(409)},
        description='{"alias": "production", "version": 3} points the alias at version 3 '
        "(one version per alias per model; it moves if it was elsewhere); "
        '"version": null removes it.',
    )
    def post(self, request, name):
        model = _model(name)
        body = AliasSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        alias, number = body.validated_data["alias"], body.validated_data["version"]
        with registry_errors():
            services.alias_set(model=model, alias=alias, number=number, actor=request.user)
        return Response({"alias": alias, "version": number})
