"""Finding and stopping the daemons a local cluster started, by pid file and by
the cluster directory in their command line or environment (guards pid reuse)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def is_running(pid: int) -> bool:
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return False
    # The state letter follows the command name in parentheses; Z is a zombie.
    state = stat.rsplit(b")", 1)[-1].split()[0:1]
    return state not in ([b"Z"], [b"X"])


def pid_from_file(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def daemon_pid(pidfile: Path, marker: str) -> int | None:
    """The pid in ``pidfile`` if that process runs and its command line names ``marker``."""
    pid = pid_from_file(pidfile)
    if pid and is_running(pid) and marker.encode() in _read(f"/proc/{pid}/cmdline"):
        return pid
    return None


def processes_mentioning(marker: str) -> list[int]:
    """Processes whose command line or environment contains ``marker``."""
    needle = marker.encode()
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        if not is_running(pid):
            continue
        if needle in _read(f"/proc/{pid}/cmdline") or needle in _read(f"/proc/{pid}/environ"):
            found.append(pid)
    return found


def stop(pids: list[int], *, timeout: float = 10.0) -> list[int]:
    """SIGTERM, wait, then SIGKILL what is left. Returns pids still running."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if is_running(p)]
        if alive:
            time.sleep(0.05)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # A killed process takes a moment to exit (longer on a busy host): what this returns
    # is what is still running, not what has yet to finish dying.
    deadline = time.monotonic() + 2.0
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if is_running(p)]
    return alive


# What a daemon mtc starts may inherit from mtc: nothing secret (no MTC_*, no
# DATABASE_URL, no admin password). Jobs run under these daemons; /proc/<pid>/environ
# must not tell anyone what mtc knows.
DAEMON_ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "TZ")


def daemon_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in DAEMON_ENV_ALLOW}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    env.update(extra)
    return env
