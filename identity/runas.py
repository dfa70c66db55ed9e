"""Running a process as a user's account (mtc is root) or as mtc itself."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from typing import Protocol


class Account(Protocol):
    name: str
    uid: int
    gid: int


def _switch(account: Account) -> bool:
    return os.geteuid() == 0 and account.uid != os.geteuid()


def demote(account: Account) -> Callable[[], None]:
    """A ``preexec_fn`` that drops to the account: its group only, then its uid."""

    def preexec() -> None:
        os.setgroups([account.gid])
        os.setgid(account.gid)
        os.setuid(account.uid)

    return preexec


def _as_kwargs(account: Account, kw: dict) -> dict:
    """subprocess keywords that start the child as the account (argument lists only).
    Uses subprocess's own user/group switch, which is safe in threaded processes."""
    if kw.get("shell"):
        raise ValueError("run_as takes an argument list, not a shell command")
    if _switch(account):
        kw.update(user=account.uid, group=account.gid, extra_groups=[account.gid])
        env = kw.get("env")
        if env is not None:
            env = {**env, "USER": account.name, "LOGNAME": account.name}
            kw["env"] = env
    return kw


def run_as(account: Account, argv: list[str], **kw) -> subprocess.CompletedProcess:
    """``subprocess.run(argv)`` as the account (argument lists only, never a shell)."""
    return subprocess.run(argv, **_as_kwargs(account, kw))


def popen_as(account: Account, argv: list[str], **kw) -> subprocess.Popen:
    """``subprocess.Popen(argv)`` as the account: a long-running process of theirs."""
    return subprocess.Popen(argv, **_as_kwargs(account, kw))
