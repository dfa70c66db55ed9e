from contextlib import contextmanager

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response

from clusters.models import Cluster
from identity.sources.base import IdentityMissing
from mtc.api.errors import ApiError
from mtc.api.schema import errors
from mtc.fielderrors import FieldErrors
from mtc.numbers import is_whole_number
from slurm import SlurmError
from slurm.queue import JOB_ID_RE

from .. import selectors, services, usage
from ..filtersets import JobFilterSet
from ..models import Job
from ..tally import ClusterTally
from .serializers import (
    JOB_ROW_FIELDS,
    JobDetailSerializer,
    JobOutputSerializer,
    JobSerializer,
    JobSubmitSerializer,
    UsageSerializer,
    job_row_representation,
)


def slurm_error(exc: SlurmError) -> ApiError:
    if exc.permanent:
        return ApiError(code="SLURM_REJECTED", message=f"Slurm refused: {exc}")
    return ApiError(
        code="UNAVAILABLE",
        message=f"Slurm is not answering: {exc}",
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
    )


@contextmanager
def job_errors(invalid: str = "Invalid job"):
    """The API's answer to what submitting or controlling a job can raise."""
    try:
        yield
    except FieldErrors as exc:  # SubmissionError, and a recipe's LaunchError
        raise ApiError(
            code="INVALID_ARGUMENT", message=f"{invalid}: {exc}", fields=exc.fields
        ) from exc
    except services.JobConflict as exc:
        raise ApiError(
            code="FAILED_PRECONDITION", message=str(exc), status_code=status.HTTP_409_CONFLICT
        ) from exc
    except SlurmError as exc:
        raise slurm_error(exc) from exc
    except IdentityMissing as exc:  # no POSIX account to run the job as
        raise ApiError(
            code="PERMISSION_DENIED", message=str(exc), status_code=status.HTTP_403_FORBIDDEN
        ) from exc


class ClusterJobsMixin:
    def cluster(self) -> Cluster:
        if getattr(self, "_cluster", None) is None:  # one lookup a request
            self._cluster = get_object_or_404(Cluster, cluster_id=self.kwargs["cluster_id"])
        return self._cluster

    def job(self) -> Job:
        job_id = self.kwargs["job_id"]
        if not JOB_ID_RE.fullmatch(job_id):
            raise ApiError(
                code="INVALID_ARGUMENT",
                message="job_id must look like 123 or 123_4.",
                fields={"job_id": "Must match ^\\d+(_\\d+)?$."},
            )
        qs = selectors.jobs_visible_to(self.request.user, self.cluster())
        return get_object_or_404(qs.prefetch_related("events"), job_id=job_id)


# What submitting or controlling a job can answer besides the usual (job_errors above).
JOB_ERRORS = errors(400, 403, 409, 503)


class JobListView(ClusterJobsMixin, GenericAPIView):
    serializer_class = JobSerializer
    filterset_class = JobFilterSet
    queryset = Job.objects.none()

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema: no cluster to look up
            return Job.objects.none()
        qs = selectors.jobs_visible_to(self.request.user, self.cluster())
        return qs.defer("script", "options")  # the list shows neither

    @extend_schema(operation_id="jobs_list", responses=JobSerializer(many=True))
    def get(self, request, cluster_id):
        qs = self.filter_queryset(self.get_queryset())
        rows = selectors.job_rows(qs, JOB_ROW_FIELDS, cluster=self.cluster())
        # The same rows, counted without the joins that name them; all of the cluster's
        # (an operator's list, unfiltered) from its tally, whatever its history.
        everything = request.user.is_staff and not any(
            name in request.query_params for name in JobFilterSet.base_filters
        )
        rows.count_from = ClusterTally(self.cluster()) if everything else qs
        page = self.paginate_queryset(rows)
        return self.get_paginated_response([job_row_representation(row) for row in page])

    @extend_schema(
        operation_id="jobs_submit",
        request=JobSubmitSerializer,
        responses={201: JobSerializer, **JOB_ERRORS},
        examples=[
            OpenApiExample(
                "hello",
                value={"name": "hello", "script": "#!/bin/bash\nsrun hostname\n", "nodes": 1},
                request_only=True,
            )
        ],
        description="Submit a batch job, run as your Unix account. 400 names each bad field.",
    )
    def post(self, request, cluster_id):
        cluster = self.cluster()
        with job_errors():
            submission = services.job_validate(cluster=cluster, data=request.data)
            job = services.job_submit(cluster=cluster, owner=request.user, submission=submission)
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)


class JobDetailView(ClusterJobsMixin, GenericAPIView):
    serializer_class = JobDetailSerializer

    @extend_schema(responses={200: JobDetailSerializer, **errors(400)})
    def get(self, request, cluster_id, job_id):
        return Response(JobDetailSerializer(self.job()).data)


class JobActionView(ClusterJobsMixin, GenericAPIView):
    serializer_class = JobSerializer
    action_name = ""

    @extend_schema(request=None, responses={202: JobSerializer, **JOB_ERRORS})
    def post(self, request, cluster_id, job_id):
        job = self.job()
        with job_errors():
            job = services.job_control(job=job, action=self.action_name, actor=request.user)
        return Response(JobSerializer(job).data, status=status.HTTP_202_ACCEPTED)


class JobOutputView(ClusterJobsMixin, GenericAPIView):
    serializer_class = JobOutputSerializer

    @extend_schema(
        operation_id="jobs_output",
        parameters=[
            OpenApiParameter("stream", str, enum=["stdout", "stderr"], default="stdout"),
            OpenApiParameter(
                "offset", {"type": "integer", "minimum": 0}, description="Byte offset to read from"
            ),
        ],
        responses={200: JobOutputSerializer},
    )
    def get(self, request, cluster_id, job_id):
        stream = request.query_params.get("stream", "stdout")
        raw_offset = request.query_params.get("offset", "0")
        fields = {}
        if stream not in ("stdout", "stderr"):
            fields["stream"] = "Must be stdout or stderr."
        if not is_whole_number(raw_offset):
            fields["offset"] = "Must be a whole number of bytes (0 or more)."
        if fields:
            raise ApiError(
                code="INVALID_ARGUMENT", message="Invalid output request.", fields=fields
            )
        job = self.job()
        return Response(selectors.job_output(job, stream=stream, offset=int(raw_offset)))


class UsageView(GenericAPIView):
    serializer_class = UsageSerializer

    @extend_schema(
        operation_id="usage_list",
        tags=["usage"],
        parameters=[
            OpenApiParameter("cluster", str, required=True, description="The cluster's id"),
            OpenApiParameter("group_by", str, enum=list(usage.GROUP_BYS), default="user"),
            OpenApiParameter("bucket", str, enum=list(usage.BUCKETS), default="day"),
            OpenApiParameter(
                "start", {"type": "string", "format": "date"}, description="Default: end - 29 d"
            ),
            OpenApiParameter(
                "end", {"type": "string", "format": "date"}, description="Inclusive; default today"
            ),
        ],
        responses={200: UsageSerializer, **errors(400, 404)},
        description=(
            "GPU-hours, CPU-hours and job counts per user, account or partition and per "
            "day or week, from the accounting figures of finished jobs. A job counts in "
            "the bucket of the day (UTC) it ended. Users see their own jobs, operators all."
        ),
    )
    def get(self, request):
        try:
            cluster_id, values = usage.usage_query_parse(request.query_params)
        except usage.UsageError as exc:
            raise ApiError(
                code="INVALID_ARGUMENT", message=f"Invalid usage request: {exc}", fields=exc.fields
            ) from exc
        cluster = get_object_or_404(Cluster, cluster_id=cluster_id)
        query = usage.UsageQuery(cluster=cluster, **values)
        return Response(usage.usage_report(request.user, query))
