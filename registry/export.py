"""Running a version's export: ``python -m node.export`` in a subprocess with memory and
time limits, as the job owner's account. Loading a DCP checkpoint unpickles its
``.metadata``, which the owner can write, so mtc itself never opens the checkpoint;
it takes back only the files it can check (registry/intake.py)."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from identity.runas import Account, run_as
from mtc import userfs
from node.export import EXIT_EXPORT_ERROR

OUT_NAME = "model"  # what the export writes inside the staging directory
STDERR_TAIL = 4000  # bytes of the export's stderr kept for the failure message
OUT_OF_MEMORY = (
    "MemoryError",
    "can't allocate memory",
    "Cannot allocate memory",
    "failed to map segment",  # a shared library that does not fit
)


class ExportFailed(Exception):
    """The export did not produce a usable directory (the message says why)."""


@dataclass(frozen=True)
class MtcAccount:
    """mtc's own account, for exports that run as mtc (single-user, mtc's own jobs)."""

    name: str
    uid: int
    gid: int


def mtc_account() -> MtcAccount:
    uid = os.geteuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return MtcAccount(name=name, uid=uid, gid=os.getegid())


@dataclass(frozen=True)
class Staging:
    """A fresh directory the export's account owns, held open by mtc: ``fd`` stays
    this directory whatever the owner renames or links in its place."""

    path: Path
    fd: int

    @property
    def out(self) -> Path:
        return self.path / OUT_NAME


@contextlib.contextmanager
def staging_dir(parent: Path, account: Account, *, prefix: str) -> Iterator[Staging]:
    """A new directory under ``parent`` (the owner's job root, which exists) owned by
    ``account``, removed afterwards with everything in it. The owner can write in
    ``parent``: everything here goes through mtc.userfs (no link followed)."""
    # A worker that died mid-way left one; a younger one may be another run's, still going.
    too_old = time.time() - export_limits()[1] - 300
    with contextlib.suppress(OSError):
        for name in userfs.list_dir(parent):
            if name.startswith(prefix):
                with contextlib.suppress(OSError):
                    if userfs.lookup(parent / name).st_mtime < too_old:
                        userfs.remove(parent / name)
    path, fd = userfs.dir_temp(parent, account, prefix=prefix)
    try:
        yield Staging(path=path, fd=fd)
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            userfs.remove(path)


def export_limits() -> tuple[int, int]:
    """(address-space bytes, wall-clock seconds) an export may use."""
    memory = int(settings.MTC_EXPORT_MEMORY_GB * 2**30)
    return memory, max(1, int(settings.MTC_EXPORT_TIMEOUT_S))


def export_argv(*, checkpoint: Path, out: Path, info: dict) -> list[str]:
    memory, seconds = export_limits()
    # CPU time counts every thread: the wall-clock timeout is the real bound, this one
    # stops a process that somehow outlives it. SIGXCPU at the soft limit, then SIGKILL.
    cpu = seconds * max(1, os.cpu_count() or 1)
    return [
        "prlimit",
        f"--as={memory}",
        f"--cpu={cpu}:{cpu + 30}",
        "--",
        sys.executable,
        "-P",  # never the working directory (the owner's) on sys.path
        "-m",
        "node.export",
        "--checkpoint",
        str(checkpoint),
        "--out",
        str(out),
        "--info",
        json.dumps(info),
    ]


def _export_env(home: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "PYTHONPATH": str(settings.BASE_DIR),
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


class _Tail:
    """Drains a pipe keeping only its last bytes: the export's output is the owner's
    to make as long as they like, mtc's memory is not."""

    def __init__(self, fd: int):
        self.fd, self.data = fd, b""
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        with contextlib.suppress(OSError):  # closed under it: the export is over
            while chunk := os.read(self.fd, 65536):
                self.data = (self.data + chunk)[-STDERR_TAIL:]

    def text(self) -> str:
        self.thread.join(timeout=5)  # a grandchild may hold the pipe: do not wait on it
        return self.data.decode("utf-8", "replace")


def export_run(*, account: Account, checkpoint: Path, staging: Staging, info: dict) -> None:
    """Run the export as ``account`` into ``staging.out``; raises ExportFailed."""
    memory, seconds = export_limits()
    argv = export_argv(checkpoint=checkpoint, out=staging.out, info=info)
    read_end, write_end = os.pipe()
    tail = _Tail(read_end)
    try:
        try:
            done = run_as(
                account,
                argv,
                cwd=str(staging.path),
                env=_export_env(staging.path),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=write_end,
                timeout=seconds,
            )
        finally:
            os.close(write_end)
    except subprocess.TimeoutExpired:
        raise ExportFailed(f"it ran past {seconds} s (MTC_EXPORT_TIMEOUT_S)") from None
    finally:
        stderr = tail.text()
        os.close(read_end)
    if done.returncode != 0:
        raise ExportFailed(_why(done.returncode, stderr, memory))


def _why(returncode: int, stderr: str, memory: int) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    if returncode == EXIT_EXPORT_ERROR and lines:
        return lines[-1]
    if any(sign in stderr for sign in OUT_OF_MEMORY):
        return f"it needed more than {memory / 2**30:g} GiB of memory (MTC_EXPORT_MEMORY_GB)"
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return f"it was stopped by {_signal_name(-returncode)} (its CPU time limit)"
    if returncode < 0:
        return f"it died of {_signal_name(-returncode)}: {_last(lines)}"
    return f"exit status {returncode}: {_last(lines)}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _last(lines: list[str], limit: int = 300) -> str:
    return " | ".join(lines[-3:])[-limit:] or "(no output)"
