"""Entry point: ``python -m node.train.train --config /abs/run/dir/run.json``.

Run by torchrun (one worker per GPU, or one per node on CPU) or as a plain process.
On start it resumes from the newest complete checkpoint in run_dir/checkpoints; with
none there it starts from ``init_from`` (continued-pretrain, sft, rl) or from scratch.

Exit codes: 0 done (or stopped by ``MTC_STOP_AT_STEP=N``, which simulates a preemption
right after step N's checkpoint), 2 bad configuration or inputs, 143 stopped by SIGTERM
or SIGUSR1 (a checkpoint is saved first; Slurm requeues or cancels the job), 1 a crash.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch

from .checkpoint import (
    PendingSave,
    checkpoint_finish,
    checkpoint_save,
    checkpoint_save_async,
)
from .config import SAVING_EVENT, STOP_NOW_FILE, ConfigError, RunConfig, load_config
from .corpus import CorpusError
from .distributed import Dist, dist_close, dist_init, exit_process
from .metrics import MetricsLogger, peak_flops, progress_line
from .model import autocast, flops_per_token
from .optim import lr_at
from .presets import param_count
from .stacks import stacks_install
from .start import Prepared, RunError, run_prepare
from .steptimes import StepTimes
from .tokenizer import TOKENIZER_FILE

log = logging.getLogger("mtc.runtime")
EXIT_SIGNAL = 143
REQUEUE_FILE = "requeue.json"  # run_dir: the batch script requeues the job (SIGUSR1)
_STOP: dict = {"signum": 0, "now_file": None}


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever sys.stdout is now (the Slurm output file; pytest's capture)."""

    def emit(self, record):
        self.stream = sys.stdout
        super().emit(record)


def _logging_setup(rank: int) -> None:
    handler = next((h for h in log.handlers if isinstance(h, _StdoutHandler)), None)
    if handler is None:
        handler = _StdoutHandler(sys.stdout)
        log.addHandler(handler)
    handler.setFormatter(logging.Formatter(f"mtc[rank {rank}] %(levelname)s %(message)s"))
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)


def say(d: Dist, text: str) -> None:
    if d.is_main:
        print(text, flush=True)


class _StopSignals:
    """SIGTERM/SIGUSR1 ask for a checkpoint at the end of the current step; the ranks
    agree through the step's all-reduce, so all of them stop after the same step."""

    def __init__(self, run_dir: Path | None = None):
        self.saved = {}
        self.run_dir = run_dir

    def __enter__(self):
        _STOP["signum"] = 0
        _STOP["now_file"] = self.run_dir / STOP_NOW_FILE if self.run_dir else None
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGUSR1):
                self.saved[sig] = signal.signal(sig, self._handle)
        return self

    @staticmethod
    def _handle(signum, frame):
        now_file = _STOP["now_file"]
        if signum == signal.SIGTERM and now_file is not None and now_file.exists():
            os._exit(EXIT_SIGNAL)  # no checkpoint: see STOP_NOW_FILE
        _STOP["signum"] = signum

    def __exit__(self, *exc):
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)


def _dataset(task) -> dict:
    """What the run read: documents (pairs, for sft/rl from a file) and tokens."""
    tokens = getattr(task, "tokens", None)
    if tokens is not None:
        return {"dataset_documents": tokens.documents, "dataset_tokens": len(tokens)}
    pairs = getattr(getattr(task, "source", None), "pairs", None)
    return {"dataset_documents": len(pairs)} if pairs is not None else {}


def _step_of(path: str) -> int:
    tail = path.rstrip("/").rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def run(cfg: RunConfig, d: Dist) -> int:
    p = run_prepare(cfg, d)
    if d.is_main:  # a request the batch script did not act on is not for this run
        (cfg.path / REQUEUE_FILE).unlink(missing_ok=True)
    fpt = flops_per_token(p.preset, cfg.seq_len)
    peak = peak_flops(d.device) * d.world
    n_params = param_count(p.preset)
    metrics = MetricsLogger(
        cfg.path, enabled=d.is_main, purge_step=p.start_step + 1 if p.resume else None
    )
    for path, why in p.skipped:
        metrics.event("checkpoint_skipped", _step_of(path), path=path, reason=why)
    metrics.event(
        "start",
        p.start_step,
        recipe=cfg.recipe,
        model=p.preset.name,
        family=p.preset.family,
        params=n_params,
        world_size=d.world,
        device=d.device.type,
        precision=p.precision,
        flops_per_token=fpt,
        peak_flops=peak,
        vocab=p.tok.vocab_size,
        **_dataset(p.task),
    )
    backend = f"FSDP2/{'nccl' if d.device.type == 'cuda' else 'gloo'}" if d.enabled else "single"
    say(
        d,
        f"mtc runtime: {cfg.recipe} {p.preset.family}/{p.preset.name} "
        f"({n_params / 1e6:.2f}M params) world {d.world} ({backend}) on {d.device.type}, "
        f"{p.precision}, {cfg.steps} steps, batch {cfg.global_batch}x{cfg.seq_len}",
    )
    if p.resume is not None:
        metrics.event("resumed", p.start_step, from_step=p.start_step, checkpoint=str(p.resume))
        say(d, f"resumed from {p.resume} (step {p.start_step})")
    elif p.init is not None:
        say(d, f"initialised from {p.init}")
    timer = StepTimes(cfg.path, rank=d.rank, world=d.world)  # per rank: stragglers
    try:
        return _loop(cfg, d, p, metrics, fpt, peak, timer)
    finally:
        metrics.close()
        timer.close()


def _loop(
    cfg: RunConfig, d: Dist, p: Prepared, metrics, fpt: float, peak: float, timer: StepTimes
) -> int:
    stop_at = int(os.environ.get("MTC_STOP_AT_STEP") or 0)
    copy_files = {TOKENIZER_FILE: cfg.path / TOKENIZER_FILE, "model.json": cfg.path / "model.json"}
    trainer_state = {
        "recipe": cfg.recipe,
        "model": p.preset.name,
        "family": p.preset.family,
        "init_checkpoint": p.ref_init,
        "tokenizer": p.tok.fingerprint(),
        "config": cfg.to_dict(),
    }
    if p.start_step >= cfg.steps:
        say(d, f"nothing to do: the checkpoint is at step {p.start_step} of {cfg.steps}")
    save = {
        "d": d,
        "root": cfg.checkpoint_dir,
        "model": p.model,
        "optimizer": p.optimizer,
        "trainer_state": trainer_state,
        "copy_files": copy_files,
        "keep": cfg.keep_checkpoints,
    }
    pending: PendingSave | None = None
    for step in range(p.start_step + 1, cfg.steps + 1):
        m, signalled = _train_step(cfg, d, p, step, timer)
        timer.step_end(step, m["step_time_s"])
        m["tokens_per_s"] = m.pop("tokens") / m["step_time_s"]
        m["mfu"] = m["tokens_per_s"] * fpt / peak
        metrics.step(step, m)
        if d.is_main and (step % cfg.log_interval == 0 or step in (1, cfg.steps)):
            print(progress_line(step, cfg.steps, m), flush=True)
        if pending is not None and pending.done():
            pending = _finish(d, pending, metrics)
        stop = signalled or step == stop_at
        interval = cfg.checkpoint_interval
        if stop or step == cfg.steps:
            # The job ends after this one: wait for one in flight, then save in the open.
            pending = _finish(d, pending, metrics)
            # No line until it is written: the hang detector gives an announced save longer.
            metrics.event(SAVING_EVENT, step)
            t0 = time.time()
            path = checkpoint_save(step=step, **save)
            seconds = time.time() - t0
            metrics.event("checkpoint", step, path=str(path), seconds=round(seconds, 3))
            say(d, f"checkpoint {path.name} saved ({seconds:.2f}s)")
        elif interval and step % interval == 0:
            pending = _finish(d, pending, metrics)
            pending = checkpoint_save_async(step=step, **save)
        if stop:
            reason = "signal" if signalled else "MTC_STOP_AT_STEP"
            metrics.event("stopped", step, reason=reason)
            say(d, f"stopped after step {step} ({reason})")
            if _STOP["signum"] == signal.SIGUSR1 and step < cfg.steps:
                _ask_requeue(cfg, d, step)
            return EXIT_SIGNAL if signalled else 0
    pending = _finish(d, pending, metrics)
    metrics.event("done", cfg.steps)
    say(d, f"done: {cfg.steps} steps")
    return 0


def _finish(d: Dist, pending: PendingSave | None, metrics) -> None:
    """Complete an async interval checkpoint (waiting for it, when it is still writing)."""
    if pending is None:
        return None
    path = checkpoint_finish(d, pending)
    seconds = time.time() - pending.started
    metrics.event(
        "checkpoint",
        pending.step,
        path=str(path),
        seconds=round(seconds, 3),
        blocking_seconds=round(pending.blocked, 3),
        mode="async",
    )
    say(d, f"checkpoint {path.name} saved ({seconds:.2f}s, {pending.blocked:.2f}s blocking)")
    return None


def _ask_requeue(cfg: RunConfig, d: Dist, step: int) -> None:
    """SIGUSR1 (Slurm's ``--signal``, ahead of a time limit or a preemption) stops the
    job without Slurm requeueing it: the batch script requeues it when this file is there
    (SIGTERM comes with Slurm's own requeue or cancel, and needs none)."""
    if d.is_main:
        (cfg.path / REQUEUE_FILE).write_text(json.dumps({"step": step, "signal": "SIGUSR1"}))


def _train_step(
    cfg: RunConfig, d: Dist, p: Prepared, step: int, timer: StepTimes | None = None
) -> tuple[dict, bool]:
    """One optimizer step over the global batch; the loss is normalised by the number of
    counted tokens (or sequences, for rl) over all ranks and micro-batches."""
    t0 = time.perf_counter()
    lr = lr_at(
        step,
        lr=cfg.lr,
        steps=cfg.steps,
        warmup_steps=cfg.warmup_steps,
        schedule=cfg.lr_schedule,
        min_lr_ratio=cfg.min_lr_ratio,
    )
    for group in p.optimizer.param_groups:
        group["lr"] = lr
    timer = timer or StepTimes(cfg.path, rank=d.rank, world=1)  # a no-op
    mbs, extra = p.task.prepare(p.model, step)
    with timer.comm():
        (weight,) = d.all_reduce([sum(mb["weight"] for mb in mbs)])
    scale = d.world / max(weight, 1.0)  # FSDP averages gradients over ranks
    loss_sum = torch.zeros((), dtype=torch.float64, device=d.device)
    # FSDP2 reduce-scatters after every micro-batch's backward and sums into the sharded
    # gradients: no micro-batch keeps a full-size fp32 gradient alive (what skipping the
    # sync until the last one would do, a whole model's worth per rank).
    for mb in mbs:
        with autocast(d, p.precision):
            loss = p.task.loss(p.model, mb)
        (loss * scale).backward()
        loss_sum += loss.detach().double()
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(p.model.parameters(), max_norm)
    if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
        grad_norm = grad_norm.full_tensor()
    p.optimizer.step()
    p.optimizer.zero_grad(set_to_none=True)
    with timer.comm():
        sums = d.all_reduce(
            [
                float(loss_sum),
                sum(mb["tokens"] for mb in mbs),
                extra.get("reward_sum", 0.0),
                extra.get("reward_n", 0),
                sum(mb.get("kl_sum", 0.0) for mb in mbs),
                float(_STOP["signum"]),
            ]
        )
    if d.device.type == "cuda":
        torch.cuda.synchronize()
    m = {
        "loss": sums[0] / max(weight, 1.0),
        "lr": lr,
        "grad_norm": float(grad_norm),
        "tokens": sums[1],
        "step_time_s": time.perf_counter() - t0,
    }
    if cfg.recipe == "rl":
        m["reward"] = sums[2] / max(sums[3], 1.0)
        if cfg.rl.kl_coef > 0:
            m["kl"] = sums[4] / max(sums[3], 1.0)
    return m, sums[5] > 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m node.train.train")
    parser.add_argument("--config", required=True, help="path of run.json")
    args = parser.parse_args(argv)
    d = dist_init()
    _logging_setup(d.rank)
    try:
        cfg = load_config(args.config)
        # Stacks on SIGURG for the poller's hang detection (node/train/stacks.py).
        stacks = stacks_install(cfg.path, d.rank)  # noqa: F841 - open while the run lasts
        if cfg.require_cuda and d.device.type != "cuda":
            raise RunError(
                "this job was launched on a GPU pool, but torch finds no CUDA device here "
                f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}, "
                f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}); "
                "it would train on CPU. Check the node's driver and that the job got GPUs."
            )
        # From before the setup (tokenizer, data, model), which can take minutes: a
        # signal then stops the run after its first step, instead of killing the rank.
        if d.is_main:  # mtc's request was for the run before this one
            (cfg.path / STOP_NOW_FILE).unlink(missing_ok=True)
        with _StopSignals(cfg.path):
            return run(cfg, d)
    except (ConfigError, RunError, CorpusError, FileNotFoundError) as exc:
        log.error("%s", exc)
        return 2
    finally:
        dist_close(d)


if __name__ == "__main__":
    exit_process(main())
