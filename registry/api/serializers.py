"""The registry in the API. Reads are built from rows the selectors already joined
(no query per row); writes are plain serializers that only check shapes, the rules
live in registry.services."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from mtc.api.fields import StrictCharField, StrictIntegerField, StrictRegexField

from ..models import Model, ModelVersion
from ..names import ALIAS_RE, NAME_RE


class SourceJobSerializer(serializers.Serializer):
    cluster_id = serializers.CharField()
    job_id = serializers.CharField()


class VersionSerializer(serializers.Serializer):
    model = serializers.CharField(source="model.name")
    number = serializers.IntegerField()
    ref = serializers.SerializerMethodField(help_text="models/<name>@<number>, for init_from")
    state = serializers.CharField(help_text="PENDING (exporting), READY or FAILED")
    status_message = serializers.CharField()
    source_job = serializers.SerializerMethodField()
    cluster = serializers.CharField(source="cluster.cluster_id", allow_null=True)
    recipe = serializers.CharField()
    parameters = serializers.JSONField()
    data = serializers.JSONField()
    metrics = serializers.JSONField()
    parent = serializers.SerializerMethodField(help_text="<model>@<number> it started from")
    children = serializers.SerializerMethodField(help_text="Versions that started from it")
    aliases = serializers.SerializerMethodField()
    checkpoint_path = serializers.CharField()
    export_path = serializers.CharField(help_text="save_pretrained directory once READY")
    created_by = serializers.CharField(source="created_by.username", allow_null=True)
    create_time = serializers.DateTimeField()

    def get_ref(self, version: ModelVersion) -> str:
        return f"models/{version.model.name}@{version.number}"

    @extend_schema_field(SourceJobSerializer(allow_null=True))
    def get_source_job(self, version: ModelVersion) -> dict | None:
        job = version.source_job
        if job is None:
            return None
        return {"cluster_id": job.cluster.cluster_id, "job_id": job.job_id}

    def get_parent(self, version: ModelVersion) -> str | None:
        return str(version.parent) if version.parent_id else None

    def get_children(self, version: ModelVersion) -> list[str]:
        return [str(child) for child in version.children.all()]

    def get_aliases(self, version: ModelVersion) -> list[str]:
        return sorted(a.alias for a in version.aliases.all())


class ModelSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    owner = serializers.CharField(source="owner.username", allow_null=True)
    version_count = serializers.IntegerField()
    latest_version = serializers.IntegerField(source="latest_number", allow_null=True)
    aliases = serializers.SerializerMethodField(help_text="{alias: version number}")
    create_time = serializers.DateTimeField()
    update_time = serializers.DateTimeField()

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "integer"}})
    def get_aliases(self, model: Model) -> dict[str, int]:
        return {a.alias: a.version.number for a in model.aliases.all()}


class ModelDetailSerializer(ModelSerializer):
    versions = VersionSerializer(
        many=True, source="recent_versions", help_text="The newest versions (all: /versions)"
    )


class ModelCreateSerializer(serializers.Serializer):
    name = StrictRegexField(NAME_RE, max_length=63)
    description = StrictCharField(required=False, allow_blank=True, max_length=10000)


class VersionCreateSerializer(serializers.Serializer):
    cluster_id = StrictCharField(help_text="The cluster the source job ran on")
    job_id = StrictCharField(help_text="A COMPLETED recipe job; its final checkpoint")


class AliasSerializer(serializers.Serializer):
    alias = StrictRegexField(ALIAS_RE, max_length=32)
    version = StrictIntegerField(
        min_value=1, allow_null=True, help_text="The version number; null removes the alias"
    )
