"""A user's POSIX account: the uid/gid their jobs run as."""

from django.conf import settings
from django.db import models


class PosixAccount(models.Model):
    SOURCES = [("local", "local"), ("ldap", "ldap"), ("single-user", "single-user")]

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="posix_account"
    )
    name = models.CharField(max_length=32, help_text="POSIX user name")
    uid = models.IntegerField()
    gid = models.IntegerField()
    home = models.CharField(max_length=512)
    source = models.CharField(max_length=16, choices=SOURCES)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # Accounts mtc makes never share a uid or name; in single-user mode every
            # user maps to mtc's own account, so the constraint leaves that source out.
            models.UniqueConstraint(
                fields=["uid"], condition=models.Q(source="local"), name="posix_local_uid_unique"
            ),
            models.UniqueConstraint(
                fields=["name"], condition=models.Q(source="local"), name="posix_local_name_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.uid}:{self.gid}, {self.source})"

    @property
    def isolated(self) -> bool:
        """Whether jobs under this account are kept apart from mtc and other users."""
        return self.source != "single-user"
