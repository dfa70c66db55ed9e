from datetime import datetime

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..models import Job, JobEvent


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
        return {
            "job_id": job.job_id,
            "cluster": job.cluster.cluster_id,
            "name": job.name,
            "user": job.user,
            "owner": job.owner.username if job.owner_id else None,
            "partition": job.partition,
            "state": job.state,
            "reason": job.reason,
            "nodes": job.nodes,
            "node_list": job.node_list,
            "cpus": job.cpus,
            "gpus_per_node": job.gpus_per_node,
            "gpus": job.gpus,
            "time_limit": job.time_limit,
            "submit_time": _iso(job.submit_time),
            "start_time": _iso(job.start_time),
            "end_time": _iso(job.end_time),
            "exit_code": job.exit_code,
            "requeue_count": job.requeue_count,
            "elapsed_s": job.elapsed_s,
            "cpu_time_s": job.cpu_time_s,
            "max_rss_bytes": job.max_rss_bytes,
            "gpus_allocated": job.gpus_allocated,
            "array_task_id": job.array_task_id,
            "recipe": job.recipe,
            "register_as": job.register_as,
            "parameters": job.parameters,
            "checkpoint_dir": job.checkpoint_dir,
            "metrics": job.metrics,
            "update_time": _iso(job.update_time),
        }


class JobDetailSerializer(JobSerializer):
    options = serializers.DictField(help_text="The submitted options")
    script = serializers.CharField()
    history = JobEventSerializer(source="events", many=True, read_only=True)

    def to_representation(self, job: Job) -> dict:
        data = super().to_representation(job)
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
