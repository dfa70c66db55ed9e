"""Process group setup from torchrun's environment, and the few collectives the loop uses.
Without torchrun (no WORLD_SIZE or WORLD_SIZE=1) everything is a no-op on one process."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    # A gloo group of all ranks for async checkpoint saves: their collectives run in a
    # background thread, and must not interleave with the training loop's on the default
    # group (which, on GPUs, is NCCL and has no CPU backend async_save needs).
    checkpoint_group: object = None

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def share(self, total: int) -> tuple[int, int]:
        """(first, count) of this rank's part of ``total`` samples: contiguous parts whose
        sizes differ by at most one (the loss is normalised over all ranks' tokens)."""
        base, extra = divmod(total, self.world)
        first = self.rank * base + min(self.rank, extra)
        return first, base + (1 if self.rank < extra else 0)

    def micro_share(self, total: int, micro: int | None) -> tuple[int, int, int]:
        """(first, count, micro-batch size) of this rank's part of ``total``. With
        ``micro`` set, every rank must run the same number of micro-batches: a rank with
        one backward more than the others would wait in its collective forever."""
        first, count = self.share(total)
        if not micro:
            return first, count, count
        if total % self.world or (total // self.world) % micro:
            raise ValueError(
                f"micro_batch {micro} does not split global_batch {total} evenly over "
                f"{self.world} ranks: global_batch must be a multiple of {self.world * micro}"
            )
        return first, count, micro

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """Sum (or max) a few floats over ranks, as float64."""
        if not self.enabled:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self._comm_device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return t.tolist()

    def broadcast(self, obj):
        """Rank 0's picklable object, on every rank."""
        if not self.enabled:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0, device=self._comm_device)
        return box[0]

    @property
    def _comm_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")


def dist_init() -> Dist:
    """Join the job's process group: NCCL on CUDA, gloo on CPU. OMP_NUM_THREADS sets
    torch's intra-op threads (the batch script sets it per process)."""
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    group = None
    if world > 1:
        if not dist.is_initialized():
            if cuda:
                dist.init_process_group("nccl", device_id=device)
            else:
                dist.init_process_group("gloo")
        group = dist.new_group(backend="gloo")
    return Dist(
        rank=rank, world=world, local_rank=local_rank, device=device, checkpoint_group=group
    )


def dist_close(d: Dist) -> None:
    if d.enabled and dist.is_initialized():
        dist.destroy_process_group()


def exit_process(code: int) -> NoReturn:
    """End a rank's process with ``code`` once its work is done and its process group is
    destroyed, without the interpreter's teardown: torch's C++ threads (gloo's) can abort
    a process there (SIGABRT, "terminate called without an active exception"), which
    would turn a rank that finished its work into a failed step, and its job into FAILED."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone: nothing left to lose
            pass
    os._exit(code)
