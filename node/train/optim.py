"""AdamW and the learning-rate schedule (a pure function of the step, so resuming needs
no scheduler state beyond the step itself)."""

from __future__ import annotations

import math

import torch


def optimizer_build(model, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW, betas (0.9, 0.95); no weight decay on norms and other 1-D parameters."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "norm" in name else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # The fused kernel (CPU and CUDA) is one pass over each tensor list: fastest here.
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True)


def lr_at(
    step: int, *, lr: float, steps: int, warmup_steps: int, schedule: str, min_lr_ratio: float
) -> float:
    """Learning rate of optimizer step ``step`` (1-based): linear warm-up to ``lr``, then
    cosine / linear decay to ``lr * min_lr_ratio`` at the last step, or constant."""
    if warmup_steps > 0 and step <= warmup_steps:
        return lr * step / warmup_steps
    if schedule == "constant":
        return lr
    floor = lr * min_lr_ratio
    progress = min(1.0, max(0.0, (step - warmup_steps) / max(1, steps - warmup_steps)))
    if schedule == "linear":
        return lr - (lr - floor) * progress
    return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
