"""The cluster spec and its PATCH body as OpenAPI components (docs/spec.md). These only
document: clusters/spec.py validates, including what JSON Schema cannot say (partitions
name existing pools, one login pool, node limits)."""

from __future__ import annotations

from rest_framework import serializers

from ..spec import ID_RE, LABEL_VALUE_RE, MACHINE_TYPE_RE, PROVIDERS, PROVISIONING_MODELS

ID = ID_RE.pattern


def _optional(field: serializers.Field) -> serializers.Field:
    # The validator reads null as "not given" for every optional field.
    field.required = False
    field.allow_null = True
    return field


class ScalingSpecSerializer(serializers.Serializer):
    min_node_count = serializers.IntegerField(min_value=0)
    max_node_count = _optional(
        serializers.IntegerField(min_value=0, help_text="Default: min_node_count")
    )


class MachineSpecSerializer(serializers.Serializer):
    machine_type = serializers.RegexField(
        MACHINE_TYPE_RE.pattern, help_text="e.g. a3-ultragpu-8g; local-N on the local provider"
    )
    accelerator_type = _optional(serializers.CharField(help_text="e.g. NVIDIA_H200_141GB"))
    accelerator_count = _optional(serializers.IntegerField(min_value=0, max_value=16))
    reservation_affinity = _optional(serializers.DictField())


class NodePoolSpecSerializer(serializers.Serializer):
    id = serializers.RegexField(ID)
    machine_spec = MachineSpecSerializer()
    scaling_spec = ScalingSpecSerializer()
    provisioning_model = _optional(serializers.ChoiceField(choices=PROVISIONING_MODELS))
    boot_disk = _optional(serializers.DictField())
    zone = _optional(serializers.CharField())


class PartitionSpecSerializer(serializers.Serializer):
    id = serializers.CharField()
    node_pool_ids = serializers.ListField(child=serializers.CharField())
    default = _optional(serializers.BooleanField())


class SlurmSpecSerializer(serializers.Serializer):
    login_node_pool_id = serializers.CharField()
    partitions = PartitionSpecSerializer(many=True)
    prolog_bash_scripts = _optional(serializers.ListField(child=serializers.CharField()))
    epilog_bash_scripts = _optional(serializers.ListField(child=serializers.CharField()))
    config_overrides = _optional(
        serializers.DictField(child=serializers.CharField(), help_text="slurm.conf settings")
    )


class OrchestratorSpecSerializer(serializers.Serializer):
    slurm_spec = SlurmSpecSerializer()


class ClusterSpecSerializer(serializers.Serializer):
    """A whole cluster: POST /clusters."""

    cluster_id = serializers.RegexField(ID)
    display_name = _optional(serializers.CharField(max_length=200))
    provider = _optional(serializers.ChoiceField(choices=PROVIDERS))
    labels = _optional(serializers.DictField(child=serializers.RegexField(LABEL_VALUE_RE.pattern)))
    zone = _optional(serializers.CharField(help_text="Required on gce, e.g. us-central1-a"))
    network = _optional(serializers.DictField())
    node_pools = NodePoolSpecSerializer(many=True)
    storage = _optional(serializers.DictField())
    orchestrator_spec = OrchestratorSpecSerializer()


class PoolScalingSerializer(serializers.Serializer):
    id = serializers.RegexField(ID, help_text="An existing node pool's id")
    scaling_spec = ScalingSpecSerializer()


class ClusterPatchSerializer(serializers.Serializer):
    """PATCH /clusters/{cluster_id}: what is not named stays as it is."""

    node_pools = _optional(PoolScalingSerializer(many=True))
    labels = serializers.DictField(
        child=serializers.RegexField(LABEL_VALUE_RE.pattern), required=False
    )
    display_name = serializers.CharField(max_length=200, required=False)
