"""Cross-entropy from the final hidden states, chunked over the tokens.

The plain loss computes ``lm_head`` over the whole sequence and upcasts the logits to
fp32: at a 128k vocabulary that is 4.2 GB per 8k-token sequence, plus as much again for
their gradient. Here the model's forward stops at the final norm's output (transformers'
``logits_to_keep`` with no positions: its lm_head runs on nothing), and the loss goes
through ``lm_head`` ``CHUNK_TOKENS`` tokens at a time, upcasting only that chunk. Each
chunk is checkpointed: backward recomputes its logits instead of keeping them, so at
most one chunk's logits (and their gradient) exist at once. The sum is the same sum,
so the value equals the full-logits loss (tests/test_runtime_loss.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .config import LOSS_CHUNK_TOKENS as CHUNK_TOKENS


def final_hidden(model, input_ids: torch.Tensor) -> torch.Tensor:
    """The final norm's output, (batch, seq, hidden), through the model's own forward
    (so FSDP2's root hooks run as in any step), computing no logits."""
    captured: list[torch.Tensor] = []

    def keep(_module, _args, output):
        captured.append(output[0] if isinstance(output, tuple) else output.last_hidden_state)

    handle = model.model.register_forward_hook(keep)
    try:
        none = torch.zeros(0, dtype=torch.long, device=input_ids.device)
        out = model(input_ids=input_ids, use_cache=False, logits_to_keep=none)
    finally:
        handle.remove()
    hidden = captured[-1]
    if out.logits.requires_grad:  # empty; tie it in so backward reaches the root's hooks
        hidden = hidden + out.logits.sum().to(hidden.dtype)
    return hidden


def _chunk_sum(lm_head, softcap: float | None, hidden, target) -> torch.Tensor:
    logits = lm_head(hidden).float()
    if softcap:  # Gemma 2's final logit soft-capping
        logits = torch.tanh(logits / softcap) * softcap
    return F.cross_entropy(logits, target, ignore_index=-100, reduction="sum")


def chunked_ce_sum(
    model, hidden: torch.Tensor, target: torch.Tensor, chunk: int | None = None
) -> torch.Tensor:
    """Summed cross-entropy of ``lm_head(hidden)`` against ``target`` (same shape as
    hidden less its last dim; -100 does not count), ``chunk`` tokens at a time."""
    chunk = chunk or CHUNK_TOKENS
    flat = hidden.reshape(-1, hidden.size(-1))
    target = target.reshape(-1)
    softcap = getattr(model.config, "final_logit_softcapping", None)
    total = flat.new_zeros((), dtype=torch.float32)
    for start in range(0, flat.size(0), chunk):
        h, t = flat[start : start + chunk], target[start : start + chunk]
        if torch.is_grad_enabled():
            part = checkpoint(_chunk_sum, model.lm_head, softcap, h, t, use_reentrant=False)
        else:
            part = _chunk_sum(model.lm_head, softcap, h, t)
        total = total + part
    return total
