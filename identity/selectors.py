"""Reads: which identity mode mtc is in, and a user's account."""

from __future__ import annotations

import functools
import logging
import os
import stat
import sys
from pathlib import Path

from django.conf import settings

from .models import PosixAccount

log = logging.getLogger(__name__)
MODES = ("local", "ldap", "single-user")


def identity_mode() -> str:
    """``settings.MTC_IDENTITY``; unset: "local" when mtc is root and job accounts can
    run its programs, else "single-user". Without root mtc cannot start a job as anyone
    else, so it is "single-user" whatever is configured: saying so beats pretending."""
    configured = getattr(settings, "MTC_IDENTITY", "") or ""
    if os.geteuid() != 0:
        if configured not in ("", "single-user"):
            log.warning("MTC_IDENTITY=%s needs root; running single-user", configured)
        return "single-user"
    if configured:
        return configured
    return "single-user" if job_runtime_problem() else "local"


def single_user_reason() -> str:
    """Why jobs share one account, for the banner and the API ("" when they do not)."""
    if identity_mode() != "single-user":
        return ""
    if os.geteuid() != 0:
        return "mtc is not running as root, so it cannot start jobs as anyone else."
    if getattr(settings, "MTC_IDENTITY", "") == "single-user":
        return "MTC_IDENTITY=single-user is configured."
    return job_runtime_problem()


@functools.cache
def job_runtime_problem() -> str:
    """Why a job's own account could not run mtc's programs on this host ("" when it
    can): recipe, export and replica jobs run mtc's interpreter (.venv), its node code
    and write under the data dir, so every directory above them must be passable by
    others (o+x) and the interpreter executable by them. A pyenv python under /root
    (0700) is the usual reason; `make setup` builds .venv from Debian's python3."""
    interpreter = Path(sys.executable).resolve()
    needed = [
        ("mtc's Python", interpreter, stat.S_IXOTH),
        ("the .venv", Path(sys.prefix), stat.S_IXOTH),
        ("mtc's code", Path(settings.BASE_DIR), stat.S_IXOTH),
        ("the data dir", Path(settings.DATA_DIR), stat.S_IXOTH),
    ]
    for what, path, bit in needed:
        blocked = _first_closed(path, bit)
        if blocked is not None:
            return (
                f"{what} ({path}) is out of reach of other accounts: {blocked} is not "
                "passable by them (o+x), so jobs run as mtc's own account."
            )
    return ""


def _first_closed(path: Path, bit: int) -> Path | None:
    """The first of ``path`` and the directories above it that others cannot pass."""
    try:
        if not os.stat(path).st_mode & bit:
            return path
        for above in path.parents:
            if not os.stat(above).st_mode & stat.S_IXOTH:
                return above
    except OSError:
        return path
    return None


def identity_isolated() -> bool:
    return identity_mode() != "single-user"


def account_for(*, user) -> PosixAccount | None:
    if user is None or not getattr(user, "pk", None):
        return None
    return PosixAccount.objects.filter(user=user).first()
