"""One munged per cluster on this host, with the cluster's own key and socket.

The local provider's daemons authenticate through it; for a cloud cluster it is how
mtc's own Slurm commands authenticate to the remote controller (same key)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path

from mtc.secretfile import private_append, secret_create

from . import procs
from .base import ProviderError


def socket_path(root: Path) -> str:
    path = str(root / "run" / "munge.sock")
    if len(path) < 100:  # AF_UNIX paths are limited to 108 bytes
        return path
    digest = hashlib.sha1(path.encode()).hexdigest()[:16]
    return f"/tmp/mtc-munge-{digest}.sock"


def key(root: Path) -> bytes:
    """The cluster's munge key, made on first use (1 KiB of randomness)."""
    path = root / "etc" / "munge.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        secret_create(path, os.urandom(1024), mode=0o400)
    return path.read_bytes()


def pid(root: Path) -> int | None:
    return procs.daemon_pid(root / "run" / "munged.pid", socket_path(root))


def ensure(root: Path) -> None:
    """Start the cluster's munged unless it runs; return once its socket exists."""
    key(root)
    if pid(root):
        return
    for sub in ("run", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    socket = socket_path(root)
    Path(socket).unlink(missing_ok=True)
    with private_append(root / "log" / "daemons.out") as out:
        proc = subprocess.run(
            [
                "munged",
                "--force",
                f"--socket={socket}",
                f"--key-file={root / 'etc' / 'munge.key'}",
                f"--log-file={root / 'log' / 'munged.log'}",
                f"--pid-file={root / 'run' / 'munged.pid'}",
                f"--seed-file={root / 'run' / 'munged.seed'}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env=procs.daemon_env(),
            timeout=30,
            check=False,
            start_new_session=True,
        )
    if proc.returncode != 0:
        raise ProviderError(
            f"munged failed to start (exit {proc.returncode}); see {root / 'log'}",
            code="DAEMON_START_FAILED",
        )
    deadline = time.monotonic() + 5
    while not Path(socket).exists():
        if time.monotonic() > deadline:
            raise ProviderError("munged did not create its socket", code="TIMEOUT")
        time.sleep(0.05)


def stop(root: Path) -> None:
    running = pid(root)
    if running and procs.stop([running]):
        raise ProviderError(f"munged {running} would not stop", code="DAEMON_STOP_FAILED")
    Path(socket_path(root)).unlink(missing_ok=True)
