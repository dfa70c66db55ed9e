"""A one-GPU check of the training runtime, under 5 minutes, for a machine with a GPU.

    .venv/bin/python bench/gpu_check.py                    # CUDA: the real shapes
    .venv/bin/python bench/gpu_check.py --device cpu --small   # every stage, tiny, on CPU

Stages (random weights, synthetic tokens, nothing downloaded):
  versions     python, torch, CUDA/cuDNN/NCCL builds, transformers, the device, its peak
  eager        a Llama 3.2 1B-shaped model (``llama3.2-1b``), bf16, batch 1 x 4096,
               compile off: tokens/s, MFU (peak from node/train/metrics.py), peak memory
  compiled     the same with ``torch.compile`` on each decoder layer (the runtime's
               ``compile``): the same figures and the compile time (first step - a step)
               (on CPU, aot_eager runs slower than eager: it checks the path, not speed)
  runtime      the runtime's own loop (``train.run``) on one rank sharded with FSDP2
               (a one-rank process group; the runtime itself shards from two ranks on)
  checkpoint   the runtime's checkpoint code: save seconds, size, load seconds
  resume       a run stopped after step 2 (``MTC_STOP_AT_STEP``) and resumed: its losses
               at the later steps against an uninterrupted run's (max |difference|)

It prints one table, and with ``--json FILE`` writes the same rows. A stage that fails
is a FAILED row with the error; the exit status is then 1. ``--small`` uses the
``tiny`` shape, short sequences and, on CPU, the ``aot_eager`` compile backend
(Inductor's C++ build of even a tiny model takes about a minute on two cores); on CUDA
the backend is Inductor, as in the runtime.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import platform
import random
import resource
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from node.train import train  # noqa: E402
from node.train.checkpoint import checkpoint_find, checkpoint_load  # noqa: E402
from node.train.config import load_config  # noqa: E402
from node.train.distributed import Dist  # noqa: E402
from node.train.metrics import peak_flops  # noqa: E402
from node.train.model import (  # noqa: E402
    autocast,
    decoder_layers,
    flops_per_token,
    lm_loss_sum,
    model_build,
)
from node.train.optim import optimizer_build  # noqa: E402
from node.train.presets import get_preset, param_count  # noqa: E402


@dataclass
class FSDPDist(Dist):
    """One rank sharded with FSDP2 as the runtime shards two or more."""

    @property
    def enabled(self) -> bool:
        return True


def _params(preset) -> str:
    n = param_count(preset)
    return f"{n / 1e9:.2f}B params" if n >= 1e9 else f"{n / 1e6:.2f}M params"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gib(device: torch.device) -> str:
    if device.type == "cuda":
        return f"peak {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return f"process max RSS {rss / 2**30:.2f} GiB"


def stage_versions(a, device: torch.device) -> tuple[str, str]:
    import transformers

    parts = [
        f"python {platform.python_version()}",
        f"torch {torch.__version__}",
        f"transformers {transformers.__version__}",
        f"CUDA build {torch.version.cuda or 'none'}",
    ]
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        nccl = torch.cuda.nccl.version()  # a tuple in recent torch, an int before
        nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        parts += [f"cuDNN {torch.backends.cudnn.version()}", f"NCCL {nccl}"]
        what = f"{p.name}, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}"
        what += f", bf16 {'yes' if torch.cuda.is_bf16_supported() else 'NO'}"
    else:
        what = f"CPU, {torch.get_num_threads()} threads (peak is an estimate)"
    return what, ", ".join(parts) + f"; peak {peak_flops(device) / 1e12:.1f} TFLOP/s"


def stage_throughput(a, device: torch.device, backend: str | None) -> tuple[str, str]:
    preset = get_preset("llama", a.model)
    d = Dist(device=device)
    _peak_reset(device)
    model = model_build(
        preset,
        d=d,
        seed=0,
        precision=a.precision,
        activation_checkpointing=False,
        compile=backend == "inductor",  # the runtime's own compile
    )
    if backend and backend != "inductor":
        for layer in decoder_layers(model):
            layer.compile(backend=backend)
    opt = optimizer_build(model, lr=1e-4, weight_decay=0.01)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, preset.vocab_size, (a.batch, a.seq_len), generator=gen).to(device)

    def step() -> None:
        with autocast(d, a.precision):
            loss = lm_loss_sum(model, x, x) / x.numel()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    step()
    _sync(device)
    first = time.perf_counter() - t0
    for _ in range(a.warmup):
        step()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    _sync(device)
    per_step = (time.perf_counter() - t0) / a.steps
    tps = a.batch * a.seq_len / per_step
    mfu = tps * flops_per_token(preset, a.seq_len) / peak_flops(device)
    memory = _peak_gib(device)
    model = opt = None  # freed before the next stage
    _peak_reset(device)
    head = f"{tps:,.0f} tokens/s, MFU {100 * mfu:.1f}%"
    detail = (
        f"{preset.name} ({_params(preset)}), {a.precision}, "
        f"{a.batch}x{a.seq_len}, {per_step * 1e3:.0f} ms/step, {memory}"
    )
    if backend:
        detail += f", {backend}: compile {max(first - per_step, 0.0):.1f} s"
    return head, detail


def _corpus(path: Path, chars: int) -> None:
    """Synthetic text: words from a fixed alphabet, seeded (the tokenizer trains on it)."""
    rnd = random.Random(0)
    words = ["".join(rnd.choice("etaoinshrdlucmfw") for _ in range(rnd.randint(2, 8)))]
    words += ["".join(rnd.choice("etaoinshrdlucmfwyp") for _ in range(4)) for _ in range(500)]
    out, n = [], 0
    while n < chars:
        line = " ".join(rnd.choice(words) for _ in range(12)) + ".\n"
        out.append(line)
        n += len(line)
    path.write_text("".join(out))


def _run(a, d: Dist, run_dir: Path, corpus: Path, stop_at: int | None = None) -> dict:
    """``train.run`` on run.json in run_dir; returns its metrics rows by step and events."""
    cfg = {
        "recipe": "llama-pretrain",
        "model": a.run_model,
        "steps": a.run_steps,
        "checkpoint_interval": 0,
        "global_batch": a.run_batch,
        "seq_len": a.run_seq_len,
        "lr": 1e-3,
        "warmup_steps": 1,
        "precision": a.precision,
        "seed": 1234,
        "data_path": str(corpus),
        "tokenizer_vocab": 512,
        "keep_checkpoints": 1,
        "log_interval": 10**9,
        "run_dir": str(run_dir),
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps(cfg))
    os.environ.pop("MTC_STOP_AT_STEP", None)
    if stop_at:
        os.environ["MTC_STOP_AT_STEP"] = str(stop_at)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            rc = train.run(load_config(run_dir / "run.json"), d)
    finally:
        os.environ.pop("MTC_STOP_AT_STEP", None)
    if rc != 0:
        raise RuntimeError(f"train.run exited {rc}")
    steps, events = {}, []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        (events.append(row) if "event" in row else steps.__setitem__(row["step"], row))
    return {"steps": steps, "events": events}


def stage_runtime(a, d: Dist, tmp: Path, results: dict) -> tuple[str, str]:
    corpus = tmp / "corpus.txt"
    _corpus(corpus, a.corpus_chars)
    _peak_reset(d.device)
    t0 = time.perf_counter()
    ref = _run(a, d, tmp / "uninterrupted", corpus)
    seconds = time.perf_counter() - t0
    results["reference"] = ref
    last = ref["steps"][a.run_steps]
    start = next(e for e in ref["events"] if e["event"] == "start")
    head = f"{a.run_steps} steps, loss {ref['steps'][1]['loss']:.3f} -> {last['loss']:.3f}"
    detail = (
        f"train.run, FSDP2 1 rank ({'nccl' if d.device.type == 'cuda' else 'gloo'}), "
        f"{start['model']} ({_params(get_preset('llama', a.run_model))}), {start['precision']}, "
        f"{a.run_batch}x{a.run_seq_len}, {last['tokens_per_s']:,.0f} tokens/s at the last "
        f"step, MFU {100 * last['mfu']:.1f}%, {_peak_gib(d.device)}, {seconds:.1f} s in all"
    )
    return head, detail


def stage_checkpoint(a, d: Dist, tmp: Path, results: dict) -> tuple[str, str]:
    ref = results["reference"]
    save = next(e for e in ref["events"] if e["event"] == "checkpoint")
    path, _ = checkpoint_find(tmp / "uninterrupted" / "checkpoints")
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    preset = get_preset("llama", a.run_model)
    model = model_build(
        preset,
        d=d,
        seed=1,
        precision=a.precision,
        activation_checkpointing=False,
        compile=False,
    )
    opt = optimizer_build(model, lr=1e-3, weight_decay=0.01)
    _sync(d.device)
    t0 = time.perf_counter()
    checkpoint_load(d=d, path=path, model=model, optimizer=opt)
    _sync(d.device)
    load_s = time.perf_counter() - t0
    del model, opt
    shutil.rmtree(path.parent)  # a 1B model's is ~15 GB: room for the resume stage's
    head = f"save {save['seconds']:.2f} s, load {load_s:.2f} s, {size / 2**20:,.1f} MiB"
    return head, f"{path.name}: weights and AdamW state, torch.distributed.checkpoint"


def stage_resume(a, d: Dist, tmp: Path, results: dict) -> tuple[str, str]:
    ref = results["reference"]["steps"]
    stop = max(1, a.run_steps // 2)
    run_dir = tmp / "resumed"
    _run(a, d, run_dir, tmp / "corpus.txt", stop_at=stop)
    again = _run(a, d, run_dir, tmp / "corpus.txt")
    resumed = [e for e in again["events"] if e["event"] == "resumed"]
    if not resumed or resumed[-1]["from_step"] != stop:
        raise RuntimeError(f"the second run did not resume from step {stop}")
    later = range(stop + 1, a.run_steps + 1)
    diff = max(abs(again["steps"][s]["loss"] - ref[s]["loss"]) for s in later)
    verdict = "equal" if diff == 0 else f"max |diff| {diff:.2e}"
    if diff > a.resume_tolerance:
        raise RuntimeError(f"resumed losses differ from the uninterrupted run's: {diff:.3e}")
    return (
        f"losses {verdict}",
        f"stopped after step {stop}, resumed, steps {stop + 1}-{a.run_steps}",
    )


def _group(device: torch.device) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kw = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=0,
        world_size=1,
        **kw,
    )


def args_parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--small", action="store_true", help="tiny shapes (CPU, the test)")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--tmp", help="where the runs and checkpoints go (~35 GB at most on CUDA)")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq-len", type=int)
    a = ap.parse_args(argv)
    small = a.small
    a.model = "tiny" if small else "llama3.2-1b"
    a.batch = a.batch or (2 if small else 1)
    a.seq_len = a.seq_len or (64 if small else 4096)
    a.warmup, a.steps = (1, 2) if small else (3, 10)
    a.precision = "bf16" if a.device == "cuda" else "fp32"
    a.backend = "aot_eager" if small and a.device == "cpu" else "inductor"
    # The runtime stages: the same 1B shape on a GPU (its checkpoint is ~15 GB with AdamW).
    a.run_model = a.model
    a.run_batch, a.run_seq_len = (4, 32) if small else (4, 1024)
    a.run_steps = 4
    a.corpus_chars = 40_000 if small else 400_000
    # bf16 on a GPU: resumed losses can differ in the last bits (non-deterministic kernels)
    a.resume_tolerance = 0.0 if a.precision == "fp32" else 1e-2
    return a


def main(argv: list[str] | None = None) -> int:
    a = args_parse(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: use --device cpu --small", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0) if a.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    logging.getLogger("mtc.runtime").setLevel(logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="mtc-gpu-check-", dir=a.tmp))
    rows, results, failed = [], {}, False
    d = FSDPDist(device=device)

    def stage(name: str, fn, *args) -> None:
        nonlocal failed
        t0 = time.perf_counter()
        try:
            head, detail = fn(*args)
        except Exception as exc:  # a check reports every stage, whatever fails
            failed = True
            head, detail = "FAILED", f"{type(exc).__name__}: {exc}"[:300]
        rows.append({"stage": name, "result": head, "detail": detail,
                     "seconds": round(time.perf_counter() - t0, 2)})  # fmt: skip

    try:
        stage("versions", stage_versions, a, device)
        stage("eager", stage_throughput, a, device, None)
        stage("compiled", stage_throughput, a, device, a.backend)
        _group(device)
        try:
            stage("runtime", stage_runtime, a, d, tmp, results)
            if "reference" in results:
                stage("checkpoint", stage_checkpoint, a, d, tmp, results)
                stage("resume", stage_resume, a, d, tmp, results)
        finally:
            dist.destroy_process_group()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    wide = max(len(r["result"]) for r in rows)
    print(f"{'stage':<11} {'result':<{wide}} {'s':>6}  detail")
    for r in rows:
        print(f"{r['stage']:<11} {r['result']:<{wide}} {r['seconds']:6.1f}  {r['detail']}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
