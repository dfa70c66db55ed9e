"""The chunked loss and the torchtitan-style FSDP2 units on one GPU (or CPU, tiny).

1. Peak memory of the loss alone at Llama 3's 128k vocabulary and an 8k-token sequence
   (bf16 hidden states and lm_head): the whole sequence's fp32 logits against
   ``node.train.loss.chunked_ce_sum``, with the two values.
2. A one-rank FSDP2 group (NCCL on CUDA, gloo on CPU) over the ``small`` Llama preset:
   a few steps with the plain path (full logits, no checkpointing) and with the chunked
   loss and every-2nd-layer checkpointing, fp32 (losses must agree) and bf16.

    python bench/loss_check.py              # CUDA
    python bench/loss_check.py --device cpu # small shapes, anywhere
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from node.train.loss import chunked_ce_sum  # noqa: E402
from node.train.model import lm_loss_sum, lm_loss_sum_full, model_build  # noqa: E402
from node.train.presets import get_preset  # noqa: E402


def _peak(device, fn) -> tuple[float, float, float]:
    """(result, peak GiB above what was allocated before, seconds)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    else:
        peak = float("nan")
    return out, peak, time.perf_counter() - t0


def loss_memory(device, tokens: int, hidden: int, vocab: int) -> None:
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    head = torch.nn.Linear(hidden, vocab, bias=False, device=device, dtype=dtype)
    model = SimpleNamespace(lm_head=head, config=SimpleNamespace(final_logit_softcapping=None))
    h = torch.randn(tokens, hidden, device=device, dtype=dtype, requires_grad=True)
    target = torch.randint(0, vocab, (tokens,), device=device)

    def plain():
        loss = F.cross_entropy(head(h).float(), target, reduction="sum")
        loss.backward()
        return float(loss.detach())

    def chunked():
        loss = chunked_ce_sum(model, h, target)
        loss.backward()
        return float(loss.detach())

    for name, fn in (("full fp32 logits", plain), ("chunked", chunked)):
        for _ in range(2):  # the second is timed warm
            h.grad = None
            head.weight.grad = None
            value, peak, secs = _peak(device, fn)
        what = f"loss {name:17s} {tokens} tokens x {vocab} vocab: value {value / tokens:.6f}"
        print(f"{what}, peak {peak:.2f} GiB above the inputs, {secs * 1e3:.0f} ms", flush=True)


def fsdp_steps(device, precision: str, steps: int, batch: int, seq: int) -> None:
    preset = replace(get_preset("llama", "small"), max_position=max(seq, 128))
    d = SimpleNamespace(enabled=True, device=device)
    losses = {}
    for name, ac, loss_fn in (
        ("plain", "none", lm_loss_sum_full),
        ("units+chunked+every_2", "every_2", lm_loss_sum),
    ):
        model = model_build(
            preset, d=d, seed=0, precision=precision, activation_checkpointing=ac, compile=False
        )
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(1)
        losses[name] = []
        t0 = time.perf_counter()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        for _ in range(steps):
            x = torch.randint(0, preset.vocab_size, (batch, seq), generator=g).to(device)
            loss = loss_fn(model, x, x) / x.numel()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses[name].append(float(loss.detach()))
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0
        shown = [round(v, 6) for v in losses[name]]
        secs = time.perf_counter() - t0
        print(f"fsdp {precision} {name:22s} losses {shown} peak {peak:.2f} GiB, {secs:.1f} s")
        del model, opt
    a, b = losses["plain"], losses["units+chunked+every_2"]
    rel = max(abs(x - y) / abs(x) for x, y in zip(a, b, strict=True))
    print(f"fsdp {precision}: largest relative loss difference {rel:.2e}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device("cuda:0" if args.device == "cuda" else args.device)
    cuda = device.type == "cuda"
    print(f"torch {torch.__version__}, device {torch.cuda.get_device_name() if cuda else 'cpu'}")
    loss_memory(device, *((8192, 4096, 128256) if cuda else (512, 64, 4096)))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29553")
    torch.distributed.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    if cuda:
        torch.cuda.set_device(device)
    try:
        for precision in ("fp32", "bf16") if cuda else ("fp32",):
            fsdp_steps(device, precision, 4, *((4, 2048) if cuda else (2, 64)))
    finally:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
