from django.conf import settings
from django.db import models


class ApiToken(models.Model):
    """An API token; only its sha256 is kept (the key is shown once, at creation)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, default="default")
    prefix = models.CharField(max_length=8)  # shown in lists, to tell tokens apart
    key_hash = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(auto_now_add=True)
    expires = models.DateTimeField(null=True, blank=True)
    last_used = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class RetentionTally(models.Model):
    """How many rows a purge has removed, per scope (a cluster's id): figures that count
    rows (a queue's jobs) can then still say how many there were in all. Written in the
    same transaction as the delete it counts."""

    kind = models.CharField(max_length=40)  # the purge's name: "jobs"
    scope = models.CharField(max_length=64, blank=True)
    purged = models.PositiveBigIntegerField(default=0)
    last_time = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["kind", "scope"], name="retention_tally_unique")
        ]

    def __str__(self) -> str:
        return f"{self.kind}/{self.scope}: {self.purged}"
