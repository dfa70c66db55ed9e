"""Endpoints in the API. Output fields are declared for OpenAPI and built directly
(no queries here: views prefetch what these read)."""

from __future__ import annotations

from datetime import datetime

from django.urls import reverse
from rest_framework import serializers

from ..models import Endpoint, EndpointEvent, Replica


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


class EndpointCreateSerializer(serializers.Serializer):
    """The deploy request (checked by serving.deploy.endpoint_validate)."""

    model = serializers.CharField(help_text="Registered model name")
    version = serializers.JSONField(help_text="Version number (1, 2, ...) or an alias")
    cluster = serializers.CharField(help_text="cluster_id of a RUNNING cluster")
    name = serializers.CharField(required=False, help_text="Default: <model>-<version>")
    partition = serializers.CharField(required=False)
    min_replicas = serializers.IntegerField(required=False, default=1)
    max_replicas = serializers.IntegerField(required=False, help_text="Default: min_replicas")
    cpus_per_replica = serializers.IntegerField(required=False, default=1)
    gpus_per_replica = serializers.IntegerField(required=False, default=0)
    target_rps_per_replica = serializers.FloatField(
        required=False, default=4.0, help_text="Requests/s one replica should take"
    )
    load_window_s = serializers.IntegerField(
        required=False, default=30, help_text="Seconds of traffic the rate is measured over"
    )
    scale_down_delay_s = serializers.IntegerField(
        required=False, default=60, help_text="How long a lower target must hold to scale down"
    )


class ReplicaSerializer(serializers.Serializer):
    number = serializers.IntegerField()
    state = serializers.CharField()
    job_id = serializers.CharField(allow_null=True)
    job_state = serializers.CharField(allow_null=True)
    node_list = serializers.CharField(allow_null=True)
    address = serializers.CharField(allow_null=True)
    health_message = serializers.CharField()
    create_time = serializers.DateTimeField()
    ready_time = serializers.DateTimeField(allow_null=True)
    last_health_time = serializers.DateTimeField(allow_null=True)
    end_time = serializers.DateTimeField(allow_null=True)

    def to_representation(self, replica: Replica) -> dict:
        job = replica.job
        return {
            "number": replica.number,
            "state": replica.state,
            "job_id": job.job_id if job else None,
            "job_state": job.state if job else None,
            "node_list": job.node_list if job else None,
            "address": f"{replica.host}:{replica.port}" if replica.host else None,
            "health_message": replica.health_message,
            "create_time": _iso(replica.create_time),
            "ready_time": _iso(replica.ready_time),
            "last_health_time": _iso(replica.last_health_time),
            "end_time": _iso(replica.end_time),
        }


class EndpointSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    owner = serializers.CharField()
    model = serializers.CharField()
    version = serializers.IntegerField()
    version_alias = serializers.CharField()
    cluster = serializers.CharField()
    partition = serializers.CharField()
    state = serializers.CharField()
    status_message = serializers.CharField()
    chat = serializers.BooleanField()
    min_replicas = serializers.IntegerField()
    max_replicas = serializers.IntegerField()
    desired_replicas = serializers.IntegerField()
    ready_replicas = serializers.IntegerField()
    cpus_per_replica = serializers.IntegerField()
    gpus_per_replica = serializers.IntegerField()
    target_rps_per_replica = serializers.FloatField()
    load_window_s = serializers.IntegerField()
    scale_down_delay_s = serializers.IntegerField()
    replicas = ReplicaSerializer(many=True)
    completions_url = serializers.CharField()
    chat_completions_url = serializers.CharField(allow_null=True)
    create_time = serializers.DateTimeField()
    update_time = serializers.DateTimeField()

    def to_representation(self, endpoint: Endpoint) -> dict:
        replicas = endpoint.live_replicas
        completions = reverse("serving_api:endpoint-completions", args=[endpoint.pk])
        return {
            "id": endpoint.pk,
            "name": endpoint.name,
            "owner": endpoint.owner.username,
            "model": endpoint.version.model.name,
            "version": endpoint.version.number,
            "version_alias": endpoint.version_alias,
            "cluster": endpoint.cluster.cluster_id,
            "partition": endpoint.partition,
            "state": endpoint.state,
            "status_message": endpoint.status_message,
            "chat": endpoint.chat,
            "min_replicas": endpoint.min_replicas,
            "max_replicas": endpoint.max_replicas,
            "desired_replicas": endpoint.desired_replicas,
            "ready_replicas": sum(1 for r in replicas if r.state == "READY"),
            "cpus_per_replica": endpoint.cpus_per_replica,
            "gpus_per_replica": endpoint.gpus_per_replica,
            "target_rps_per_replica": endpoint.target_rps_per_replica,
            "load_window_s": endpoint.load_window_s,
            "scale_down_delay_s": endpoint.scale_down_delay_s,
            "replicas": [ReplicaSerializer(r).data for r in replicas],
            "completions_url": completions,
            "chat_completions_url": (
                reverse("serving_api:endpoint-chat-completions", args=[endpoint.pk])
                if endpoint.chat
                else None
            ),
            "create_time": _iso(endpoint.create_time),
            "update_time": _iso(endpoint.update_time),
        }


class FiguresSerializer(serializers.Serializer):
    window_s = serializers.IntegerField()
    requests = serializers.IntegerField()
    requests_per_s = serializers.FloatField()
    errors = serializers.IntegerField()
    p50_ms = serializers.FloatField(allow_null=True)
    p95_ms = serializers.FloatField(allow_null=True)
    p99_ms = serializers.FloatField(allow_null=True)


class EventSerializer(serializers.ModelSerializer):
    class Meta:
        model = EndpointEvent
        fields = ["time", "kind", "message"]


class EndpointDetailSerializer(EndpointSerializer):
    figures = FiguresSerializer(help_text="The last minute's requests")
    events = EventSerializer(many=True, help_text="The latest 20, newest first")

    def to_representation(self, endpoint: Endpoint) -> dict:
        data = super().to_representation(endpoint)
        data["figures"] = self.context["figures"]
        data["events"] = [
            {"time": _iso(e.time), "kind": e.kind, "message": e.message}
            for e in self.context["events"]
        ]
        return data


class CompletionRequestSerializer(serializers.Serializer):
    """OpenAI's completion request (only for the docs; the replica's checks apply)."""

    prompt = serializers.CharField(required=False, help_text="For /completions")
    messages = serializers.ListField(
        child=serializers.DictField(), required=False, help_text="For /chat/completions"
    )
    max_tokens = serializers.IntegerField(required=False, default=16)
    temperature = serializers.FloatField(required=False, default=1.0, help_text="0: greedy")
    top_p = serializers.FloatField(required=False, default=1.0)
    n = serializers.IntegerField(required=False, default=1, help_text="Only 1")
    stop = serializers.JSONField(required=False, help_text="A string or up to 4 strings")
    seed = serializers.IntegerField(required=False)
    stream = serializers.BooleanField(
        required=False, default=False, help_text="true: server-sent events as tokens come"
    )
    stream_options = serializers.DictField(
        required=False, help_text='{"include_usage": true}: a last chunk with the usage'
    )


class CompletionResponseSerializer(serializers.Serializer):
    id = serializers.CharField()
    object = serializers.CharField(help_text="text_completion or chat.completion")
    created = serializers.IntegerField()
    model = serializers.CharField()
    choices = serializers.ListField(child=serializers.DictField())
    usage = serializers.DictField()


class OpenAIModelSerializer(serializers.Serializer):
    """OpenAI's model object: the version an endpoint serves."""

    id = serializers.CharField(help_text="<model>@<version>, as answers name it")
    object = serializers.CharField(help_text="model")
    created = serializers.IntegerField(help_text="When the version was registered (epoch s)")
    owned_by = serializers.CharField(help_text="The endpoint's owner")


class OpenAIModelListSerializer(serializers.Serializer):
    object = serializers.CharField(help_text="list")
    data = OpenAIModelSerializer(many=True)


class SeriesSerializer(serializers.Serializer):
    window_s = serializers.IntegerField()
    bucket_s = serializers.IntegerField()
    series = serializers.ListField(child=serializers.DictField())
