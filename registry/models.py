"""The model registry: named models, their numbered versions and aliases."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from .names import ALIAS_RE, NAME_RE


class VersionState(models.TextChoices):
    PENDING = "PENDING", "Exporting"
    READY = "READY", "Ready"
    FAILED = "FAILED", "Failed"


class Model(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[RegexValidator(NAME_RE)])
    description = models.TextField(blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="models",
    )
    # Numbers are never reused, even after a delete: "name@3" always meant one version.
    last_version_number = models.PositiveIntegerField(default=0)
    create_time = models.DateTimeField(auto_now_add=True)
    update_time = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ModelVersion(models.Model):
    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField(help_text="1, 2, 3 ... per model")
    state = models.CharField(
        max_length=16, choices=VersionState.choices, default=VersionState.PENDING
    )
    status_message = models.CharField(max_length=500, blank=True)
    # Where it came from: the job, its cluster, recipe and parameters, its data.
    source_job = models.OneToOneField(
        "jobs.Job",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="model_version",
    )
    cluster = models.ForeignKey(
        "clusters.Cluster",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="model_versions",
    )
    recipe = models.CharField(max_length=64, blank=True)
    parameters = models.JSONField(default=dict, blank=True)
    data = models.JSONField(default=dict, blank=True, help_text="The training data it saw")
    metrics = models.JSONField(default=dict, blank=True, help_text="Final figures")
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="children",
        help_text="The version this one started from (init_from)",
    )
    checkpoint_path = models.CharField(max_length=500, blank=True, help_text="Source checkpoint")
    export_path = models.CharField(
        max_length=500, blank=True, help_text="save_pretrained directory (safetensors)"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    create_time = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model", "number"]
        constraints = [
            models.UniqueConstraint(fields=["model", "number"], name="version_number_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.model.name}@{self.number}"


class ModelAlias(models.Model):
    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="aliases")
    alias = models.CharField(max_length=32, validators=[RegexValidator(ALIAS_RE)])
    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="aliases")
    update_time = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model", "alias"]
        constraints = [
            models.UniqueConstraint(fields=["model", "alias"], name="alias_unique_per_model"),
        ]

    def __str__(self) -> str:
        return f"{self.model.name}@{self.alias}"
