"""The cluster spec and its PATCH body as OpenAPI components (docs/spec.md). These only
document: clusters/spec.py validates, including what JSON Schema cannot say (partitions
name existing pools, one login pool, node limits)."""

from __future__ import annotations

from rest_framework import serializers

from ..spec import ID_RE, LABEL_VALUE_RE, MACHINE_TYPE_RE, PROVIDERS, PROVISIONING_MODELS

ID = ID_RE.pattern


# The validator reads null as "not given" for every optional field. (Passed to each field:
# DRF rebuilds bound fields from their arguments, so setting attributes later is lost.)
OPTIONAL = {"required": False, "allow_null": True}
OPTIONAL_TEXT = {**OPTIONAL, "allow_blank": True}  # "" reads as "not given" too


class ScalingSpecSerializer(serializers.Serializer):
    min_node_count = serializers.IntegerField(min_value=0)
    max_node_count = serializers.IntegerField(
        min_value=0, help_text="Default: min_node_count", **OPTIONAL
    )


class MachineSpecSerializer(serializers.Serializer):
    machine_type = serializers.RegexField(
        MACHINE_TYPE_RE.pattern, help_text="e.g. a3-ultragpu-8g; local-N on the local provider"
    )
    accelerator_type = serializers.CharField(help_text="e.g. NVIDIA_H200_141GB", **OPTIONAL_TEXT)
    accelerator_count = serializers.IntegerField(min_value=0, max_value=16, **OPTIONAL)
    reservation_affinity = serializers.DictField(**OPTIONAL)


class NodePoolSpecSerializer(serializers.Serializer):
    id = serializers.RegexField(ID)
    machine_spec = MachineSpecSerializer()
    scaling_spec = ScalingSpecSerializer()
    spare_node_count = serializers.IntegerField(
        min_value=0,
        help_text="Nodes held idle as hot spares (drained, reason 'spare'); fewer than "
        "min_node_count. Default: 0",
        **OPTIONAL,
    )
    provisioning_model = serializers.ChoiceField(choices=PROVISIONING_MODELS, **OPTIONAL_TEXT)
    boot_disk = serializers.DictField(**OPTIONAL)
    zone = serializers.CharField(**OPTIONAL_TEXT)


class PartitionSpecSerializer(serializers.Serializer):
    id = serializers.CharField()
    node_pool_ids = serializers.ListField(child=serializers.CharField())
    default = serializers.BooleanField(**OPTIONAL)


class SlurmSpecSerializer(serializers.Serializer):
    login_node_pool_id = serializers.CharField()
    partitions = PartitionSpecSerializer(many=True)
    prolog_bash_scripts = serializers.ListField(child=serializers.CharField(), **OPTIONAL)
    epilog_bash_scripts = serializers.ListField(child=serializers.CharField(), **OPTIONAL)
    config_overrides = serializers.DictField(
        child=serializers.CharField(), help_text="slurm.conf settings", **OPTIONAL
    )


class OrchestratorSpecSerializer(serializers.Serializer):
    slurm_spec = SlurmSpecSerializer()


class ClusterSpecSerializer(serializers.Serializer):
    """A whole cluster: POST /clusters."""

    cluster_id = serializers.RegexField(ID)
    display_name = serializers.CharField(max_length=200, **OPTIONAL_TEXT)
    provider = serializers.ChoiceField(choices=PROVIDERS, **OPTIONAL_TEXT)
    labels = serializers.DictField(
        child=serializers.RegexField(LABEL_VALUE_RE.pattern, allow_blank=True), **OPTIONAL
    )
    zone = serializers.CharField(help_text="Required on gce, e.g. us-central1-a", **OPTIONAL_TEXT)
    network = serializers.DictField(**OPTIONAL)
    node_pools = NodePoolSpecSerializer(many=True)
    storage = serializers.DictField(**OPTIONAL)
    orchestrator_spec = OrchestratorSpecSerializer()


class PoolScalingSerializer(serializers.Serializer):
    id = serializers.RegexField(ID, help_text="An existing node pool's id")
    scaling_spec = ScalingSpecSerializer()


class ClusterPatchSerializer(serializers.Serializer):
    """PATCH /clusters/{cluster_id}: what is not named stays as it is."""

    node_pools = PoolScalingSerializer(many=True, **OPTIONAL)
    labels = serializers.DictField(
        child=serializers.RegexField(LABEL_VALUE_RE.pattern, allow_blank=True),
        help_text="Replaces the labels; null clears them",
        **OPTIONAL,
    )
    display_name = serializers.CharField(max_length=200, required=False)
