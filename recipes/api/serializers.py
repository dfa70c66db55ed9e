"""Recipe API bodies, for the schema: the views build these dicts directly."""

from __future__ import annotations

from rest_framework import serializers


class RecipeParameterSerializer(serializers.Serializer):
    name = serializers.CharField()
    type = serializers.CharField()
    default = serializers.JSONField(allow_null=True)
    help = serializers.CharField()
    required = serializers.BooleanField()
    minimum = serializers.FloatField(required=False)
    maximum = serializers.FloatField(required=False)
    choices = serializers.ListField(child=serializers.JSONField(), required=False)


class RecipeSerializer(serializers.Serializer):
    id = serializers.CharField()
    title = serializers.CharField()
    description = serializers.CharField()
    family = serializers.CharField()
    parameters = RecipeParameterSerializer(many=True)


class RecipeListSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    results = RecipeSerializer(many=True)


class LaunchSerializer(serializers.Serializer):
    nodes = serializers.IntegerField(required=False, min_value=1)
    partition = serializers.CharField(required=False)
    overrides = serializers.DictField(required=False, help_text="Recipe parameters")
    register_as = serializers.CharField(required=False, help_text="A model name")
    dry_run = serializers.BooleanField(required=False, default=False)


class LaunchPlanSerializer(serializers.Serializer):
    recipe = serializers.CharField()
    parameters = serializers.DictField()
    script = serializers.CharField()
    run_config = serializers.DictField()
    register_as = serializers.CharField()


class JobMetricSeriesSerializer(serializers.Serializer):
    job_id = serializers.CharField()
    recipe = serializers.CharField()
    summary = serializers.DictField()
    first_step = serializers.IntegerField(allow_null=True, help_text="First step stored")
    last_step = serializers.IntegerField(allow_null=True, help_text="Last step stored")
    downsampled = serializers.BooleanField(help_text="Whether steps were left out")
    stride = serializers.IntegerField(help_text="Steps between the points returned")
    series = serializers.ListField(
        child=serializers.DictField(), help_text="{step, time, loss, ...} per logged step"
    )
