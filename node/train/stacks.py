"""Every rank's Python stacks on demand, for hang detection (recipes/hang.py).

Each rank registers faulthandler on SIGURG (a signal neither Slurm, torchrun nor the
runtime uses; its default action is to ignore it, so the batch shell and torchrun are
unaffected). faulthandler's handler is C code that needs no GIL: a rank blocked inside
a collective still writes its stacks, and a stopped rank writes nothing. Each dump is
appended to ``<run>/stacks/rank-R.txt``, after a header line that names the rank and
its node, so the poller tells a fresh dump by the file's growth.

mtc asks by writing ``<run>/stacks/request`` anew: a thread of each rank watches it and
signals its own process. (A signal from Slurm reaches only a step's tasks under
proctrack/cgroup, which is torchrun, not its ranks.) The watcher runs while the main
thread waits in a collective (it releases the GIL there); a stopped rank answers
nothing, as before.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
import time
from pathlib import Path
from typing import TextIO

STACKS_SIGNAL = signal.SIGURG
STACKS_DIR = "stacks"
REQUEST_FILE = "request"  # written anew by mtc for each dump it wants
WATCH_S = 0.2


def stacks_request_path(run_dir: Path) -> Path:
    return run_dir / STACKS_DIR / REQUEST_FILE


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns, info.st_size


def _watch(path: Path) -> None:
    """Signal this process for a dump each time the request file changes."""
    seen = _signature(path)
    while True:
        time.sleep(WATCH_S)
        now = _signature(path)
        if now is not None and now != seen:
            os.kill(os.getpid(), STACKS_SIGNAL)
        seen = now


def stacks_path(run_dir: Path, rank: int) -> Path:
    return run_dir / STACKS_DIR / f"rank-{rank}.txt"


def stacks_install(run_dir: Path, rank: int) -> TextIO | None:
    """Register the dump for this rank; returns the open file (kept for the run's life).
    None where signals cannot be registered (not the main thread, no SIGURG)."""
    path = stacks_path(run_dir, rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - open for the run's life
        node = os.environ.get("SLURMD_NODENAME", "")
        fh.write(f"# mtc stacks: rank {rank} node {node} pid {os.getpid()}\n")
        fh.flush()
        faulthandler.register(STACKS_SIGNAL, file=fh, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError, AttributeError):
        return None
    watcher = threading.Thread(
        target=_watch, args=(stacks_request_path(run_dir),), name="mtc-stacks", daemon=True
    )
    watcher.start()
    return fh
