"""Gradient accumulation under FSDP2, on two gloo ranks (torch.multiprocessing, no
torchrun, no Slurm): micro-batches give the full batch's loss, and every micro-batch's
gradients are reduce-scattered into shards at once (no unsharded full-size grads)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from mtc.devstack import free_port

from .test_runtime_train import exit_rank, write_config

STEPS = 3


def _grads_are_sharded(model) -> None:
    """After a micro-batch's backward every parameter holds its reduce-scattered shard of
    the gradient (with the sync deferred, FSDP2 keeps them unsharded and .grad is None)."""
    from torch.distributed.tensor import DTensor

    for name, param in model.named_parameters():
        assert isinstance(param.grad, DTensor), f"{name}: no sharded gradient yet"
        assert param.grad.to_local().shape == param.to_local().shape, name
        assert param.grad.to_local().numel() < param.numel(), f"{name}: a full-size gradient"


def _worker(rank: int, world: int, port: int, root: str) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    from node.train.distributed import dist_close, dist_init

    d = dist_init()
    try:
        result = _runs(d, root)
    finally:
        dist_close(d)
    exit_rank(root, rank, result)


def _runs(d, root: str) -> dict[str, list[float]]:
    """Both runs' losses. In a function of its own so that the models, their FSDP state
    and gloo work handles are gone before the process group is destroyed."""
    from node.train import train
    from node.train.config import load_config
    from node.train.start import run_prepare

    result: dict[str, list[float]] = {}
    for micro in ("full", "micro"):
        cfg = load_config(str(Path(root) / micro / "run.json"))
        p = run_prepare(cfg, d)
        loss = p.task.loss
        seen: list[int] = []  # the micro-batches of this step so far

        def checked(model, mb, loss=loss, seen=seen):
            if seen:  # the previous micro-batch's backward has run
                _grads_are_sharded(model)
            seen.append(1)
            return loss(model, mb)

        p.task.loss = checked
        result[micro] = []
        for step in range(1, STEPS + 1):
            seen.clear()
            result[micro].append(train._train_step(cfg, d, p, step)[0]["loss"])
            assert len(seen) == (4 if micro == "micro" else 1), len(seen)
    return result


def test_micro_batches_reduce_scatter_each_and_match_the_full_batch(tmp_path):
    common = dict(steps=STEPS, checkpoint_interval=0, global_batch=8, corpus_bytes=200_000)
    write_config(tmp_path / "full", **common)
    write_config(tmp_path / "micro", micro_batch=1, **common)  # 4 micro-batches per rank
    torch.set_num_threads(1)
    mp.spawn(_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert results[0] == results[1]  # every rank reports the all-reduced loss
    full, micro = results[0]["full"], results[0]["micro"]
    assert micro == pytest.approx(full, rel=1e-5) and full[-1] < full[0]
