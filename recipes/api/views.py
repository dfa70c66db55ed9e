"""Recipes in the API: the catalog, launching, and a job's metric series."""

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from clusters.models import Cluster
from jobs.api.serializers import JobSerializer
from jobs.api.views import ClusterJobsMixin, job_errors
from jobs.selectors import METRIC_POINTS, METRIC_POINTS_MAX, job_metric_points
from mtc.api.errors import ApiError
from mtc.api.schema import errors
from mtc.numbers import is_whole_number

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
        ", its sbatch options (what Slurm gets) and the parameters, and submits nothing. "
        '"register_as": "<model>" registers the '
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
                        "options": plan.options,
                        "run_config": plan.run_config,
                        "register_as": plan.register_as,
                    }
                )
            job = recipe_launch(cluster=cluster, recipe_id=recipe, body=body, owner=request.user)
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)


def _step_param(request, name: str, *, low: int, high: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if not is_whole_number(raw) or not low <= int(raw) <= high:
        raise ApiError(
            code="INVALID_ARGUMENT",
            message=f"{name} must be a whole number from {low} to {high}.",
            fields={name: f"Must be a whole number from {low} to {high}."},
        )
    return int(raw)


class JobMetricsView(ClusterJobsMixin, APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter(
                "points",
                int,
                description=f"At most this many points (3-{METRIC_POINTS_MAX}, default "
                f"{METRIC_POINTS}): a longer run is downsampled to an even stride over its "
                "steps, its first and last step kept.",
            ),
            OpenApiParameter("start_step", int, description="Only steps from this one on"),
            OpenApiParameter("end_step", int, description="Only steps up to this one"),
        ],
        operation_id="jobs_metrics",
        responses={200: JobMetricSeriesSerializer, **errors(400)},
        description="The run's per-step series. `downsampled` says whether steps were "
        "left out; `stride` is the distance between the steps returned, `first_step` and "
        "`last_step` the range stored. Ask again with start_step/end_step to zoom in.",
    )
    def get(self, request, cluster_id, job_id):
        job = self.job()
        points = _step_param(request, "points", low=3, high=METRIC_POINTS_MAX)
        start = _step_param(request, "start_step", low=0, high=2**31 - 1)
        end = _step_param(request, "end_step", low=0, high=2**31 - 1)
        window = job_metric_points(
            job.pk, points=points or METRIC_POINTS, start_step=start, end_step=end
        )
        series = [{"step": step, "time": time, **values} for step, time, values in window.rows]
        return Response(
            {
                "job_id": job.job_id,
                "recipe": job.recipe,
                "summary": job.metrics,
                "first_step": window.first_step,
                "last_step": window.last_step,
                "downsampled": window.downsampled,
                "stride": window.stride,
                "series": series,
            }
        )
