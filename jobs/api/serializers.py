from rest_framework import serializers

from ..models import Job, JobEvent


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["time", "state", "reason", "cause"]


class JobSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", default=None, read_only=True)
    cluster = serializers.CharField(source="cluster.cluster_id", read_only=True)
    gpus = serializers.IntegerField(read_only=True)

    class Meta:
        model = Job
        fields = [
            "job_id",
            "cluster",
            "name",
            "user",
            "owner",
            "partition",
            "state",
            "reason",
            "nodes",
            "node_list",
            "cpus",
            "gpus_per_node",
            "gpus",
            "time_limit",
            "submit_time",
            "start_time",
            "end_time",
            "exit_code",
            "requeue_count",
            "array_task_id",
            "recipe",
            "parameters",
            "checkpoint_dir",
            "metrics",
            "update_time",
        ]


class JobDetailSerializer(JobSerializer):
    history = JobEventSerializer(source="events", many=True, read_only=True)

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "options", "script", "history"]


class JobSubmitSerializer(serializers.Serializer):
    """Documents the submit body; validation is jobs.slurm.submit.validate_submission."""

    name = serializers.CharField()
    script = serializers.CharField()
    partition = serializers.CharField(required=False)
    nodes = serializers.IntegerField(required=False, default=1)
    ntasks_per_node = serializers.IntegerField(required=False, default=1)
    gpus_per_node = serializers.IntegerField(required=False, default=0)
    cpus_per_task = serializers.IntegerField(required=False, default=1)
    time_limit = serializers.CharField(required=False)
    env = serializers.DictField(child=serializers.CharField(), required=False)
    requeue = serializers.BooleanField(required=False, default=True)
    dependency = serializers.CharField(required=False)
    array = serializers.CharField(required=False)


class JobOutputSerializer(serializers.Serializer):
    stream = serializers.CharField()
    offset = serializers.IntegerField()
    next_offset = serializers.IntegerField()
    size = serializers.IntegerField()
    data = serializers.CharField()
    eof = serializers.BooleanField()
    available = serializers.BooleanField()
