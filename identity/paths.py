"""Directories that belong to a user's account: made by mtc (root), then handed over.

Everything above them is passable but not listable (0711), so a job reaches its own
directory by its path and sees nothing else there."""

from __future__ import annotations

import os
from pathlib import Path

from .runas import Account


def traverse_only(path: Path) -> None:
    """Others may pass through ``path`` (o+x) but not list it."""
    path.mkdir(mode=0o711, parents=True, exist_ok=True)
    if path.stat().st_uid == os.geteuid():
        os.chmod(path, 0o711)


def user_dir(path: Path, account: Account, *, mode: int = 0o700) -> Path:
    """``path`` made if missing and owned by the account, ``mode`` (0700: theirs alone)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, account.uid, account.gid)
    os.chmod(path, mode)
    return path


def give(path: Path, account: Account) -> None:
    """Hand a tree mtc wrote (a run directory) to the account."""
    if os.geteuid() != 0:
        return
    for dirpath, _dirs, filenames in os.walk(path):
        os.chown(dirpath, account.uid, account.gid)
        for name in filenames:
            os.chown(os.path.join(dirpath, name), account.uid, account.gid)
