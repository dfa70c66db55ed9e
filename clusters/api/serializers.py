from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..models import Cluster, Node, Operation
from .spec_schema import ClusterPatchSerializer, ClusterSpecSerializer

__all__ = ["ClusterPatchSerializer", "ClusterSpecSerializer"]  # the request bodies


class OperationErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()


class OperationSerializer(serializers.ModelSerializer):
    done = serializers.BooleanField(read_only=True)
    error = serializers.SerializerMethodField(help_text="Set when the operation FAILED")

    class Meta:
        model = Operation
        fields = [
            "id",
            "kind",
            "target",
            "state",
            "done",
            "progress",
            "status_message",
            "error",
            "create_time",
            "end_time",
        ]

    @extend_schema_field(OperationErrorSerializer(allow_null=True))
    def get_error(self, op: Operation) -> dict | None:
        if not op.error_code:
            return None
        return {"code": op.error_code, "message": op.error_message}


class ClusterSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(
        source="owner.username", default=None, read_only=True, allow_null=True
    )
    node_count = serializers.IntegerField(read_only=True, default=0)
    ready_node_count = serializers.IntegerField(read_only=True, default=0)
    gpu_count = serializers.IntegerField(read_only=True, default=0)

    class Meta:
        model = Cluster
        fields = [
            "cluster_id",
            "display_name",
            "provider",
            "state",
            "state_message",
            "labels",
            "node_count",
            "ready_node_count",
            "gpu_count",
            "owner",
            "spec",
            "create_time",
            "update_time",
        ]


class NodeGpusSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    type = serializers.CharField()
    emulated = serializers.BooleanField(help_text="Device nodes the local provider made")


class NodeSerializer(serializers.ModelSerializer):
    pool = serializers.CharField(source="pool.pool_id", read_only=True)
    gpus = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = [
            "name",
            "pool",
            "partition",
            "slurm_state",
            "slurm_reason",
            "spare",
            "health",
            "lifecycle",
            "cpus",
            "gpus",
            "provider_id",
            "state_time",
        ]

    @extend_schema_field(NodeGpusSerializer)
    def get_gpus(self, node: Node) -> dict:
        return {"count": node.gpus, "type": node.gpu_type, "emulated": node.gpus_emulated}
