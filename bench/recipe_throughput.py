"""Training throughput of mtc's runtime loop against a plain Hugging Face ``Trainer``.

Same model (the llama-pretrain ``tiny`` preset, built by the runtime), same data (the
runtime's tokenized default corpus, fixed-length windows with labels = inputs), same
batch, optimizer settings (AdamW, betas 0.9/0.95, weight decay 0.01, grad clip 1.0)
and schedule (warm-up + cosine), one process, this machine's CPU threads. Prints
tokens/s for each (steps after a warm-up, best of ``--repeats`` alternating runs) and
their ratio. On a CUDA machine it also runs the runtime on a Llama shape that fits one
GPU (default ``llama3.2-1b``, bf16) and prints its tokens/s and MFU.

    .venv/bin/python bench/recipe_throughput.py [--steps 200] [--batch 8] [--seq-len 64]
        [--repeats 3] [--with-compile]

MFU = tokens/s x (6N + 12 * n_layers * n_heads * head_dim * seq_len) / peak FLOP/s
(PaLM appendix B; N = parameters in matmuls). On CPU the peak is an estimate
(1e11 FLOP/s per thread, or MTC_PEAK_FLOPS), so the CPU MFU is indicative only.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from node.train import train  # noqa: E402
from node.train.distributed import Dist  # noqa: E402
from node.train.model import model_build  # noqa: E402
from node.train.presets import get_preset, param_count  # noqa: E402


def config(run_dir: Path, **over) -> Path:
    cfg = {
        "recipe": "llama-pretrain",
        "model": "tiny",
        "steps": 120,
        "checkpoint_interval": 0,
        "global_batch": 8,
        "seq_len": 64,
        "lr": 3e-3,
        "lr_schedule": "cosine",
        "warmup_steps": 5,
        "min_lr_ratio": 0.1,
        "weight_decay": 0.01,
        "grad_clip": 1.0,
        "precision": "fp32",
        "seed": 1234,
        "log_interval": 10**9,
        "run_dir": str(run_dir),
    }
    cfg.update(over)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps(cfg))
    return run_dir / "run.json"


def mtc_loop(run_dir: Path, steps: int, warmup: int, **over) -> dict:
    """Tokens/s over steps warmup+1..steps, from the run's own metrics.jsonl."""
    path = config(run_dir, steps=steps, **over)
    if (run_dir / "metrics.jsonl").exists():
        (run_dir / "metrics.jsonl").unlink()
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # each run starts fresh
    with contextlib.redirect_stdout(io.StringIO()):  # its progress lines
        assert train.main(["--config", str(path)]) == 0
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = {r["step"]: r for r in rows if "event" not in r}
    tokens = sum(r["tokens_per_s"] * r["step_time_s"] for s, r in rows.items() if s > warmup)
    seconds = rows[steps]["time"] - rows[warmup]["time"]
    mfus = sorted(r["mfu"] for s, r in rows.items() if s > warmup)
    return {"tokens_per_s": tokens / seconds, "mfu": mfus[len(mfus) // 2]}


class Windows(torch.utils.data.Dataset):
    def __init__(self, tokens: np.ndarray, seq_len: int):
        self.tokens, self.seq_len = tokens, seq_len

    def __len__(self):
        return len(self.tokens) // self.seq_len

    def __getitem__(self, k):
        x = torch.from_numpy(
            np.asarray(self.tokens[k * self.seq_len : (k + 1) * self.seq_len], dtype=np.int64)
        )
        return {"input_ids": x, "labels": x}


def run_tokens(run_dir: Path) -> np.ndarray:
    """The tokens the runtime's own run cached (data/tokens-<key>/part-N.bin, each with
    part-N.json naming its dtype), in order: the Trainer trains on the same stream."""
    cache = next(p for p in (run_dir / "data").glob("tokens-*") if p.is_dir())
    parts = []
    for meta_path in sorted(cache.glob("part-*.json")):
        meta = json.loads(meta_path.read_text())
        parts.append(np.fromfile(meta_path.with_suffix(".bin"), dtype=meta["dtype"]))
    return np.concatenate(parts)


def hf_trainer(run_dir: Path, steps: int, warmup: int, batch: int, seq_len: int) -> dict:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    tokens = run_tokens(run_dir)
    model = model_build(
        get_preset("llama", "tiny"),
        d=Dist(),
        seed=1234,
        precision="fp32",
        activation_checkpointing=False,
        compile=False,
    )
    stamps: dict[int, float] = {}

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            stamps[state.global_step] = time.perf_counter()

    args = TrainingArguments(
        output_dir=str(run_dir / "hf"),
        per_device_train_batch_size=batch,
        max_steps=steps,
        learning_rate=3e-3,
        lr_scheduler_type="cosine",
        warmup_steps=5,
        weight_decay=0.01,
        adam_beta1=0.9,
        adam_beta2=0.95,
        max_grad_norm=1.0,
        use_cpu=True,
        seed=1234,
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    with contextlib.redirect_stdout(io.StringIO()):
        Trainer(
            model=model, args=args, train_dataset=Windows(tokens, seq_len), callbacks=[Clock()]
        ).train()
    seconds = stamps[steps] - stamps[warmup]
    return {"tokens_per_s": (steps - warmup) * batch * seq_len / seconds}


def gpu_mfu(run_dir: Path, model: str, steps: int, batch: int, seq_len: int, compile: bool):
    result = mtc_loop(
        run_dir,
        steps,
        min(5, steps - 2),
        model=model,
        global_batch=batch,
        seq_len=seq_len,
        precision="bf16",
        compile=compile,
        lr=3e-4,
    )
    name = torch.cuda.get_device_name(0)
    n = param_count(get_preset("llama", model))
    print(
        f"GPU {name}: llama {model} ({n / 1e9:.2f}B params), batch {batch}x{seq_len}, bf16"
        f"{', compiled' if compile else ''}: {result['tokens_per_s']:,.0f} tokens/s, "
        f"MFU {100 * result['mfu']:.1f}%"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20, help="steps left out of the timing")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--with-compile", action="store_true", help="also mtc with torch.compile")
    ap.add_argument("--gpu-model", default="llama3.2-1b")
    ap.add_argument("--gpu-batch", type=int, default=8)
    ap.add_argument("--gpu-seq-len", type=int, default=2048)
    ap.add_argument("--gpu-steps", type=int, default=15)
    ap.add_argument("--gpu-compile", action="store_true")
    args = ap.parse_args()
    logging.getLogger("mtc.runtime").setLevel(logging.WARNING)
    os.environ.pop("MTC_STOP_AT_STEP", None)
    tmp = Path(tempfile.mkdtemp(prefix="mtc-bench-recipe-"))
    if torch.cuda.is_available():
        gpu_mfu(
            tmp / "gpu",
            args.gpu_model,
            args.gpu_steps,
            args.gpu_batch,
            args.gpu_seq_len,
            args.gpu_compile,
        )
        return

    shape = {"global_batch": args.batch, "seq_len": args.seq_len}
    ours, theirs = [], []
    for _ in range(args.repeats):  # alternate, so a busy moment does not favour one side
        ours.append(mtc_loop(tmp / "mtc", args.steps, args.warmup, **shape))
        theirs.append(hf_trainer(tmp / "mtc", args.steps, args.warmup, args.batch, args.seq_len))
    a = max(r["tokens_per_s"] for r in ours)
    b = max(r["tokens_per_s"] for r in theirs)
    each_a = ", ".join(f"{r['tokens_per_s']:,.0f}" for r in ours)
    each_b = ", ".join(f"{r['tokens_per_s']:,.0f}" for r in theirs)
    print(
        f"llama-pretrain tiny ({param_count('tiny') / 1e6:.2f}M params), batch "
        f"{args.batch}x{args.seq_len}, fp32, {torch.get_num_threads()} CPU threads, "
        f"steps {args.warmup + 1}-{args.steps}, best of {args.repeats}"
    )
    print(f"  mtc runtime loop     {a:10,.0f} tokens/s   (each run: {each_a})")
    print(f"  HF Trainer loop      {b:10,.0f} tokens/s   (each run: {each_b})")
    print(f"  ratio mtc / HF       {a / b:10.2f}x")
    if args.with_compile:
        c = mtc_loop(tmp / "mtc", args.steps, args.warmup, compile=True, **shape)["tokens_per_s"]
        print(f"  mtc loop, compiled   {c:10,.0f} tokens/s   ({c / b:.2f}x the HF Trainer loop)")
    print(f"  mtc MFU (CPU peak estimated) {100 * max(r['mfu'] for r in ours):.1f}%")


if __name__ == "__main__":
    main()
