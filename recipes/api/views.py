"""Recipes in the API: the catalog, launching, and a job's metric series."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from clusters.models import Cluster
from jobs.api.serializers import JobSerializer
from jobs.api.views import ClusterJobsMixin, job_errors
from jobs.models import JobMetric
from mtc.api.errors import ApiError
from mtc.api.schema import errors

from ..catalog import RECIPES
from ..launch import recipe_launch, recipe_plan
from .serializers import (
    JobMetricSeriesSerializer,
    LaunchPlanSerializer,
    LaunchSerializer,
    RecipeListSerializer,
)


class RecipeListView(APIView):
    @extend_schema(operation_id="recipes_list", responses={200: RecipeListSerializer})
    def get(self, request):
        results = [recipe.describe() for recipe in RECIPES.values()]
        return Response({"count": len(results), "results": results})


class RecipeLaunchView(APIView):
    @extend_schema(
        operation_id="recipes_launch",
        request=LaunchSerializer,
        responses={
            201: JobSerializer,
            200: LaunchPlanSerializer,
            **errors(400, 403, 409, 503),
        },
        description='Body: {"nodes": 2, "partition": "gpu", "overrides": {"model": "tiny", '
        '"steps": 60}}. With "dry_run": true, answers 200 with the rendered batch script '
        'and the parameters, and submits nothing. "register_as": "<model>" registers the '
        "final checkpoint as that model's next version when the job completes; "
        '"overrides": {"init_from": "models/<name>@<alias or version>"} starts from a '
        "registered version (which becomes the new version's parent).",
    )
    def post(self, request, cluster_id, recipe):
        cluster = get_object_or_404(Cluster, cluster_id=cluster_id)
        body = request.data
        dry_run = isinstance(body, dict) and body.get("dry_run") is True
        if isinstance(body, dict):
            body = {k: v for k, v in body.items() if k != "dry_run"}
        if recipe not in RECIPES:
            raise ApiError(
                code="NOT_FOUND",
                message=f"No recipe '{recipe}'.",
                status_code=status.HTTP_404_NOT_FOUND,
            )
        with job_errors("Invalid launch"):
            if dry_run:
                plan = recipe_plan(cluster=cluster, recipe_id=recipe, body=body, owner=request.user)
                return Response(
                    {
                        "recipe": recipe,
                        "parameters": plan.parameters,
                        "script": plan.script,
                        "run_config": plan.run_config,
                        "register_as": plan.register_as,
                    }
                )
            job = recipe_launch(cluster=cluster, recipe_id=recipe, body=body, owner=request.user)
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)


class JobMetricsView(ClusterJobsMixin, APIView):
    @extend_schema(
        operation_id="jobs_metrics",
        responses={200: JobMetricSeriesSerializer, **errors(400)},
        description="A recipe job's metric series.",
    )
    def get(self, request, cluster_id, job_id):
        job = self.job()
        series = [
            {"step": step, "time": time, **values}
            for step, time, values in JobMetric.objects.filter(job=job).values_list(
                "step", "time", "values"
            )
        ]
        return Response(
            {"job_id": job.job_id, "recipe": job.recipe, "summary": job.metrics, "series": series}
        )
