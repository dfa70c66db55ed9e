from datetime import datetime

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..efficiency import job_efficiency
from ..models import Job, JobEvent
from ..pending import pending_explanation


def _iso(value: datetime | None) -> str | None:
    """As DRF writes datetimes: ISO 8601, UTC as Z."""
    if value is None:
        return None
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["time", "state", "reason", "cause"]


class JobEfficiencySerializer(serializers.Serializer):
    """What seff prints for a finished job (null until accounting has its record)."""

    cpu_efficiency = serializers.FloatField(
        allow_null=True, help_text="CPU time / (elapsed x allocated CPUs), 0-1"
    )
    cpu_hours = serializers.FloatField(help_text="Allocated CPUs x elapsed, hours")
    memory_efficiency = serializers.FloatField(
        allow_null=True, help_text="Peak resident memory / allocated memory, 0-1"
    )
    max_rss_bytes = serializers.IntegerField(allow_null=True)
    mem_allocated_bytes = serializers.IntegerField(allow_null=True)
    gpu_hours = serializers.FloatField(help_text="Allocated GPUs x elapsed, hours")


class JobSerializer(serializers.Serializer):
    """A job as the API shows it. Fields are declared (not introspected from the
    model) because building a ModelSerializer's fields costs more than the rest of
    a submit request."""

    job_id = serializers.CharField(help_text="Slurm's id: 123, or 123_4 for an array task")
    cluster = serializers.CharField(source="cluster.cluster_id")
    name = serializers.CharField()
    user = serializers.CharField(help_text="The Unix account it runs as")
    owner = serializers.CharField(allow_null=True, help_text="mtc user; null for outside jobs")
    partition = serializers.CharField()
    state = serializers.CharField(help_text="Slurm's: PENDING, RUNNING, COMPLETED, FAILED, ...")
    reason = serializers.CharField()
    nodes = serializers.IntegerField()
    node_list = serializers.CharField()
    cpus = serializers.IntegerField()
    gpus_per_node = serializers.IntegerField()
    gpus = serializers.IntegerField()
    time_limit = serializers.CharField()
    submit_time = serializers.DateTimeField(allow_null=True)
    start_time = serializers.DateTimeField(allow_null=True)
    end_time = serializers.DateTimeField(allow_null=True)
    expected_start_time = serializers.DateTimeField(
        allow_null=True,
        help_text="When Slurm expects a pending job to start; null when it has no plan "
        "(held, over a limit) and once the job started",
    )
    exit_code = serializers.CharField(help_text="exit:signal, as Slurm; empty until it ends")
    requeue_count = serializers.IntegerField()
    elapsed_s = serializers.IntegerField(
        allow_null=True, help_text="Run time in seconds, from accounting once it ended"
    )
    cpu_time_s = serializers.FloatField(
        allow_null=True, help_text="CPU time its processes used, s (accounting)"
    )
    max_rss_bytes = serializers.IntegerField(
        allow_null=True, help_text="Largest resident memory of any step (accounting)"
    )
    gpus_allocated = serializers.IntegerField(
        allow_null=True, help_text="GPUs allocated (accounting's gres/gpu TRES)"
    )
    cpus_allocated = serializers.IntegerField(
        allow_null=True, help_text="CPUs allocated (accounting's cpu TRES)"
    )
    mem_allocated_bytes = serializers.IntegerField(
        allow_null=True, help_text="Memory allocated, bytes (accounting's mem TRES)"
    )
    account = serializers.CharField(help_text="Slurm account (accounting); empty until known")
    efficiency = JobEfficiencySerializer(allow_null=True)
    array_task_id = serializers.IntegerField(allow_null=True)
    recipe = serializers.CharField(help_text="Empty unless a recipe launched it")
    register_as = serializers.CharField(help_text="Model the final checkpoint registers under")
    parameters = serializers.DictField(help_text="A recipe job's parameters")
    checkpoint_dir = serializers.CharField()
    metrics = serializers.DictField(help_text="A recipe job's latest figures")
    update_time = serializers.DateTimeField()

    def to_representation(self, job: Job) -> dict:
        # The fields above document the shape (OpenAPI); this builds it directly,
        # which keeps a submit within a millisecond or so of sbatch itself.
        row = {name: getattr(job, name) for name in JOB_ROW_FIELDS}
        row["cluster_name"] = job.cluster.cluster_id
        row["owner_name"] = job.owner.username if job.owner_id else None
        return job_row_representation(row)


# A job's own columns the API shows; the list reads them with values() (jobs.selectors.
# job_rows), which spares building a Job, its User and its Cluster for every row.
JOB_ROW_FIELDS = (
    "job_id",
    "name",
    "user",
    "partition",
    "state",
    "reason",
    "nodes",
    "node_list",
    "cpus",
    "gpus_per_node",
    "time_limit",
    "submit_time",
    "start_time",
    "end_time",
    "expected_start_time",
    "exit_code",
    "requeue_count",
    "elapsed_s",
    "cpu_time_s",
    "max_rss_bytes",
    "gpus_allocated",
    "cpus_allocated",
    "mem_allocated_bytes",
    "account",
    "array_task_id",
    "recipe",
    "register_as",
    "parameters",
    "checkpoint_dir",
    "metrics",
    "update_time",
)


def job_row_representation(row: dict) -> dict:
    """JobSerializer's shape from a row of JOB_ROW_FIELDS plus cluster_name and owner_name."""
    return {
        "job_id": row["job_id"],
        "cluster": row["cluster_name"],
        "name": row["name"],
        "user": row["user"],
        "owner": row["owner_name"],
        "partition": row["partition"],
        "state": row["state"],
        "reason": row["reason"],
        "nodes": row["nodes"],
        "node_list": row["node_list"],
        "cpus": row["cpus"],
        "gpus_per_node": row["gpus_per_node"],
        "gpus": row["gpus_per_node"] * row["nodes"],  # as Job.gpus
        "time_limit": row["time_limit"],
        "submit_time": _iso(row["submit_time"]),
        "start_time": _iso(row["start_time"]),
        "end_time": _iso(row["end_time"]),
        "expected_start_time": _iso(row["expected_start_time"]),
        "exit_code": row["exit_code"],
        "requeue_count": row["requeue_count"],
        "elapsed_s": row["elapsed_s"],
        "cpu_time_s": row["cpu_time_s"],
        "max_rss_bytes": row["max_rss_bytes"],
        "gpus_allocated": row["gpus_allocated"],
        "cpus_allocated": row["cpus_allocated"],
        "mem_allocated_bytes": row["mem_allocated_bytes"],
        "account": row["account"],
        "efficiency": job_efficiency(
            elapsed_s=row["elapsed_s"],
            cpu_time_s=row["cpu_time_s"],
            cpus=row["cpus_allocated"] or row["cpus"],
            max_rss_bytes=row["max_rss_bytes"],
            mem_bytes=row["mem_allocated_bytes"],
            gpus=row["gpus_allocated"],
        ),
        "array_task_id": row["array_task_id"],
        "recipe": row["recipe"],
        "register_as": row["register_as"],
        "parameters": row["parameters"],
        "checkpoint_dir": row["checkpoint_dir"],
        "metrics": row["metrics"],
        "update_time": _iso(row["update_time"]),
    }


class JobDetailSerializer(JobSerializer):
    options = serializers.DictField(help_text="The submitted options")
    script = serializers.CharField()
    history = JobEventSerializer(source="events", many=True, read_only=True)
    pending_explanation = serializers.CharField(
        help_text="Why a pending job waits, in words, and what would let it start; empty"
        " for any other state"
    )

    def to_representation(self, job: Job) -> dict:
        data = super().to_representation(job)
        data["pending_explanation"] = pending_explanation(job)
        data["options"] = job.options
        data["script"] = job.script
        data["history"] = JobEventSerializer(job.events.all(), many=True).data
        return data


@extend_schema_field({"oneOf": [{"type": "string"}, {"type": "integer", "minimum": 1}]})
class TimeLimitField(serializers.CharField):
    """Minutes as a number, or Slurm's MM:SS, HH:MM:SS, D-HH[:MM[:SS]]."""


class JobSubmitSerializer(serializers.Serializer):
    """Documents the submit body; validation is slurm.submit.validate_submission."""

    name = serializers.CharField(max_length=128)
    script = serializers.CharField(help_text="The batch script, from #!/bin/bash on")
    partition = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    nodes = serializers.IntegerField(required=False, default=1, min_value=1)
    ntasks_per_node = serializers.IntegerField(
        required=False, default=1, min_value=1, max_value=1024
    )
    gpus_per_node = serializers.IntegerField(required=False, default=0, min_value=0)
    cpus_per_task = serializers.IntegerField(required=False, default=1, min_value=1, max_value=1024)
    time_limit = TimeLimitField(required=False, allow_blank=True)
    env = serializers.DictField(child=serializers.CharField(), required=False, allow_null=True)
    requeue = serializers.BooleanField(required=False, default=True)
    dependency = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    array = serializers.CharField(
        required=False, allow_null=True, allow_blank=True, help_text="e.g. 0-99, 1,3,5, 0-15%4"
    )


class JobOutputSerializer(serializers.Serializer):
    stream = serializers.CharField()
    offset = serializers.IntegerField()
    next_offset = serializers.IntegerField()
    size = serializers.IntegerField()
    data = serializers.CharField()
    eof = serializers.BooleanField()
    available = serializers.BooleanField()


class UsageFiguresSerializer(serializers.Serializer):
    gpu_hours = serializers.FloatField(help_text="Allocated GPUs x elapsed, hours")
    cpu_hours = serializers.FloatField(help_text="Allocated CPUs x elapsed, hours (CPUTimeRAW)")
    jobs = serializers.IntegerField(help_text="Jobs that ended in the bucket")


class UsageRowSerializer(UsageFiguresSerializer):
    group = serializers.CharField(help_text="The user, account or partition")
    bucket = serializers.DateField(help_text="The day, or the Monday of the week")


class UsageGroupSerializer(UsageFiguresSerializer):
    group = serializers.CharField()


class UsageSerializer(serializers.Serializer):
    cluster = serializers.CharField()
    group_by = serializers.ChoiceField(choices=["user", "account", "partition"])
    bucket = serializers.ChoiceField(choices=["day", "week"])
    start = serializers.DateField()
    end = serializers.DateField(help_text="Inclusive")
    attribution = serializers.CharField(
        help_text="end: a job counts whole in the bucket of the day (UTC) it ended"
    )
    buckets = serializers.ListField(child=serializers.DateField(), help_text="Every bucket")
    rows = UsageRowSerializer(many=True, help_text="Per group and bucket; empty ones left out")
    groups = UsageGroupSerializer(many=True, help_text="Per group, the whole window")
    totals = UsageFiguresSerializer()
