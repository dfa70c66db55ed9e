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


# test(1) gets nothing of mtc's environment: the account could read its /proc/<pid>/environ.
_TEST_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C"}


def account_groups(account: Account) -> list[int]:
    """The account's groups as a login would have them (its supplementary ones too)."""
    try:
        return os.getgrouplist(account.name, account.gid)
    except (KeyError, OSError):
        return [account.gid]


def _test(account: Account | None, flag: str, path: str, timeout: float) -> bool:
    kw: dict = dict(
        env=_TEST_ENV,
        cwd="/",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=timeout,
        check=False,
    )
    if account is not None and _switch(account):
        kw.update(user=account.uid, group=account.gid, extra_groups=account_groups(account))
    try:
        return subprocess.run(["test", flag, path], **kw).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def can_read(account: Account | None, path: str, *, timeout: float = 10.0) -> bool:
    """Whether the account (None: mtc itself) may read ``path``, and enter it if it is a
    directory. Asked of the kernel as the account, by test(1) run as it, so its groups,
    ACLs and every folder above count; a path that does not exist is not readable."""
    if not path.startswith("/"):  # never an option to test(1), never relative to a cwd
        return False
    if not _test(account, "-r", path, timeout):
        return False
    return not _test(account, "-d", path, timeout) or _test(account, "-x", path, timeout)
