"""Sampling completions for rl: KV-cache generation, on an unsharded copy of the policy.

Generation feeds the prompts once (prefill) and then one token per forward, keeping the
keys and values of earlier positions in a transformers ``DynamicCache``; prompts are
left-padded, so the attention mask and position ids (counted over real tokens only) go
with every forward. The logits are kept for the last position only.

Under FSDP2 every forward of the sharded policy all-gathers each layer's weights, so a
token-by-token rollout would all-gather the whole model once per generated token.
Instead the rollout gathers the full weights once (``DTensor.full_tensor``, in the
compute dtype) into a plain module, generates without any collective, and frees the copy
before the update. What it costs: the whole model once per rank (2 bytes a parameter in
bf16, 4 in fp32) plus the KV cache, held only while sampling, when there are no
gradients or activations for a backward; a rank's training state is already ~16 bytes a
parameter over the ranks (fp32 weights, gradients and two Adam moments) plus
activations, so up to ~8 ranks the copy is no larger than what training needs. When the
copy would not fit in free memory (any rank), every rank falls back to the sharded
model, which runs ``max_new_tokens`` forwards on every rank so all of them make the same
collective calls.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import os

import torch

# transformers 5 renamed the cache argument (past_key_values → cache)
_CACHE_ARG: dict[type, str] = {}


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _cache_kwargs(model, cache) -> dict:
    cls = type(model)
    if cls not in _CACHE_ARG:
        params = inspect.signature(cls.forward).parameters
        _CACHE_ARG[cls] = "cache" if "cache" in params else "past_key_values"
    return {_CACHE_ARG[cls]: cache, "use_cache": True, "logits_to_keep": 1}


def _new_cache(model):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)  # sliding-window layers (Gemma 2) need it
    except TypeError:  # older transformers
        return DynamicCache()


def left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def generate(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float,
    pad_id: int,
    eos_id: int,
    gen: torch.Generator,
    device,
    use_cache: bool = True,
    fixed_length: bool = True,
):
    """Left-padded prompts + sampled completions: (ids, attention mask, completion mask),
    always ``max_new_tokens`` columns of completion (pad, mask 0 after a row's eos).
    ``fixed_length``: run every forward even when all rows are done (a sharded model's
    ranks must make the same collective calls); else stop when all rows are done.
    ``use_cache=False`` recomputes the whole sequence for every token (the reference the
    tests compare the cached path against)."""
    ids, mask = left_pad(prompts, pad_id, device)
    n = ids.size(0)
    comp = torch.zeros_like(mask)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    cache = _new_cache(model) if use_cache else None
    step_ids = ids
    for i in range(max_new_tokens):
        if use_cache:
            pos = _positions(mask)[:, -step_ids.size(1) :]
            kw = _cache_kwargs(model, cache)
            out = model(input_ids=step_ids, attention_mask=mask, position_ids=pos, **kw)
        else:
            pos = _positions(mask)
            out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False)
        logits = out.logits[:, -1].float()
        probs = torch.softmax(logits / max(temperature, 1e-5), dim=-1)
        nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        live = (~done).long()
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        mask = torch.cat([mask, live[:, None]], dim=1)
        comp = torch.cat([comp, live[:, None]], dim=1)
        done |= nxt == eos_id
        step_ids = nxt[:, None]
        if not fixed_length and bool(done.all()) and i + 1 < max_new_tokens:
            rest = max_new_tokens - i - 1  # what the uncached path appends for done rows
            ids = torch.cat([ids, ids.new_full((n, rest), pad_id)], dim=1)
            mask = torch.cat([mask, mask.new_zeros((n, rest))], dim=1)
            comp = torch.cat([comp, comp.new_zeros((n, rest))], dim=1)
            break
    return ids, mask, comp


def _sharded(model) -> bool:
    return any(hasattr(p, "full_tensor") for p in model.parameters())


def _plain_class(model) -> type:
    """The transformers class under FSDP2's dynamic ``FSDP<Class>`` subclass."""
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":  # free on the device plus what torch's cache holds unused
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return torch.cuda.mem_get_info(device)[0] + cached
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def rollout_bytes(model, dtype: torch.dtype, rows: int, length: int) -> int:
    """The unsharded copy plus a KV cache for ``rows`` sequences of ``length`` tokens."""
    size = torch.finfo(dtype).bits // 8
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    kv = 2 * c.num_hidden_layers * kv_heads * head_dim * rows * length * size
    logits = rows * c.vocab_size * 4 * 2  # last position only, float32 and softmax
    return sum(p.numel() for p in model.parameters()) * size + kv + logits


def unsharded_copy(model, dtype: torch.dtype, device) -> torch.nn.Module:
    """A plain module with the FSDP2 model's full weights in ``dtype`` (every rank
    gathers every parameter in the same order: same collectives everywhere)."""
    with torch.device("meta"):
        plain = _plain_class(model)(copy.deepcopy(model.config))
    full = {}
    for name, p in model.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        full[name] = t.detach().to(device=device, dtype=dtype)
    plain.load_state_dict(full, strict=False, assign=True)
    if getattr(model.config, "tie_word_embeddings", False):
        plain.tie_weights()  # the tied output weight is not a separate parameter
    # Buffers (rotary frequencies, often non-persistent) are not sharded: copy them.
    for name, buf in model.named_buffers():
        owner, _, leaf = name.rpartition(".")
        plain.get_submodule(owner)._buffers[leaf] = buf.detach().clone()
    left = [n for n, t in [*plain.named_parameters(), *plain.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"unsharded rollout copy: no weights for {left[:3]}")
    plain.requires_grad_(False)
    return plain.eval()


@contextlib.contextmanager
def rollout_model(model, d, *, dtype: torch.dtype, rows: int, length: int):
    """Yields (module to sample from, whether it is unsharded). All ranks take the same
    branch: they agree through an all-reduce of "does not fit here"."""
    if not _sharded(model):
        was = model.training
        model.eval()  # gradient checkpointing turns the cache off in training mode
        try:
            yield model, True
        finally:
            model.train(was)
        return
    fits = rollout_bytes(model, dtype, rows, length) * 1.25 < _free_bytes(d.device)
    (short,) = d.all_reduce([0.0 if fits else 1.0])
    if short:
        was = model.training
        model.eval()
        try:
            yield model, False
        finally:
            model.train(was)
        return
    plain = unsharded_copy(model, dtype, d.device)
    try:
        yield plain, True
    finally:
        del plain
