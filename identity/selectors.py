"""Reads: which identity mode mtc is in, and a user's account."""

from __future__ import annotations

import logging
import os

from django.conf import settings

from .models import PosixAccount

log = logging.getLogger(__name__)
MODES = ("local", "ldap", "single-user")


def identity_mode() -> str:
    """``settings.MTC_IDENTITY`` (unset: "single-user"). Without root
    mtc cannot start a job as anyone else, so it is "single-user" whatever is
    configured: saying so beats pretending to isolate."""
    configured = getattr(settings, "MTC_IDENTITY", "") or ""
    if os.geteuid() != 0:
        if configured not in ("", "single-user"):
            log.warning("MTC_IDENTITY=%s needs root; running single-user", configured)
        return "single-user"
    # Unset means single-user for now: local accounts isolate plain jobs, but recipe and
    # replica jobs need mtc's Python and code readable by those accounts (README, Identity).
    return configured or "single-user"


def identity_isolated() -> bool:
    return identity_mode() != "single-user"


def account_for(*, user) -> PosixAccount | None:
    if user is None or not getattr(user, "pk", None):
        return None
    return PosixAccount.objects.filter(user=user).first()
