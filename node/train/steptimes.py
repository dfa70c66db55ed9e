"""Per-rank step times: each rank of a multi-rank run writes one line per step to
``run_dir/steptimes/rank-<rank>.jsonl``; mtc compares the ranks to find a straggler
(recipes/straggler.py).

A line: ``{"step", "rank", "node", "step_s", "compute_s", "comm_s", "time"}``.

- ``comm_s``: wall time inside the step's collectives: FSDP's parameter all-gathers and
  gradient reduce-scatters (synchronous on the default settings: the call returns when
  every rank has joined), and the step's explicit all-reduces (the batch weight, and the
  sums after the optimizer step). A fast rank waits there for a slow one.
- ``compute_s``: ``step_s - comm_s``, the rank's own work. Under FSDP every rank waits
  for the slowest at each collective, so a step's wall time is the same on every rank;
  its compute time is not, and a slow node's is longer by its slowness.
- ``step_s``: the whole step.

Cheap: two clock reads per collective and one short line per step, appended and flushed
(a run that is killed leaves whole lines). Each run attempt starts its file afresh, so
the file is about the ranks' current placement on nodes. The collectives are timed by
wrapping torch.distributed's functions (FSDP calls them through the module), counted on
the training thread only: an async checkpoint's collectives run on another.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import threading
import time
from pathlib import Path

import torch.distributed as dist

DIR = "steptimes"


def _node_name() -> str:
    """The Slurm node this rank runs on (several emulated nodes share one host)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


class StepTimes:
    def __init__(self, run_dir: Path, *, rank: int, world: int):
        self.rank = rank
        self.node = _node_name()
        self.fh = None
        self._comm = 0.0
        self._depth = 0  # a collective may call another: the outermost counts
        self._thread = threading.get_ident()
        if world < 2:  # no peers to compare with
            return
        directory = Path(run_dir) / DIR
        directory.mkdir(parents=True, exist_ok=True)
        self.fh = open(directory / f"rank-{rank}.jsonl", "w", encoding="utf-8")  # noqa: SIM115
        _ACTIVE[0] = self
        _wrap_collectives()

    @property
    def enabled(self) -> bool:
        return self.fh is not None

    @contextlib.contextmanager
    def comm(self):
        if threading.get_ident() != self._thread:
            yield
            return
        self._depth += 1
        started = time.perf_counter()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._comm += time.perf_counter() - started

    def step_end(self, step: int, step_s: float) -> None:
        comm = self._comm
        self._comm = 0.0
        if not self.enabled:
            return
        line = {
            "step": step,
            "rank": self.rank,
            "node": self.node,
            "step_s": round(step_s, 6),
            "compute_s": round(max(step_s - comm, 0.0), 6),
            "comm_s": round(comm, 6),
            "time": round(time.time(), 3),
        }
        self.fh.write(json.dumps(line) + "\n")
        self.fh.flush()

    def close(self) -> None:
        if _ACTIVE[0] is self:
            _ACTIVE[0] = None
        if self.fh is not None:
            self.fh.close()
            self.fh = None


_ACTIVE: list[StepTimes | None] = [None]  # the run's timer (one run per process)
# FSDP2's collectives (their current names, and the older ones).
WRAPPED = (
    "all_gather_single",
    "reduce_scatter_single",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
)


def _timed(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        timer = _ACTIVE[0]
        if timer is None:
            return fn(*args, **kwargs)
        with timer.comm():
            return fn(*args, **kwargs)

    call._mtc_timed = True
    return call


def _wrap_collectives() -> None:
    for name in WRAPPED:
        fn = getattr(dist, name, None)
        if fn is not None and not getattr(fn, "_mtc_timed", False):
            setattr(dist, name, _timed(fn))
