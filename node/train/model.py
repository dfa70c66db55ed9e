"""transformers Llama/Gemma models from a preset, sharded with FSDP2.

The model is built on the meta device, sharded (``shard_units``: as torchtitan's
``parallelize_llama`` does it), and only then materialised on the device and initialised
under the run's seed, so a 70B model never exists whole in one process's memory. FSDP2 is the
path on GPUs (NCCL) and on CPUs (gloo supports its all-gather and reduce-scatter in
this torch), so one code path serves both; bf16 on GPU is FSDP2's mixed precision
(bf16 compute, fp32 master weights and gradient reduction). A single process
(world size 1) uses the plain module, with autocast when bf16 is asked for.
"""

from __future__ import annotations

import contextlib
import logging
import warnings

import torch
import torch.nn.functional as F

from .config import ac_interval
from .presets import Preset, matmul_param_count

log = logging.getLogger("mtc.runtime")


def hf_config(p: Preset, pad_id: int = 0, bos_id: int = 1, eos_id: int = 2):
    common = dict(
        vocab_size=p.vocab_size,
        hidden_size=p.hidden_size,
        intermediate_size=p.intermediate_size,
        num_hidden_layers=p.num_layers,
        num_attention_heads=p.num_heads,
        num_key_value_heads=p.num_kv_heads,
        head_dim=p.head_dim,
        max_position_embeddings=p.max_position,
        rms_norm_eps=p.rms_norm_eps,
        tie_word_embeddings=p.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": p.rope_theta},
        pad_token_id=pad_id,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        use_cache=False,
    )
    if p.arch == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaConfig(**common), LlamaForCausalLM
    if p.arch == "gemma":
        from transformers import GemmaConfig, GemmaForCausalLM

        return GemmaConfig(**common), GemmaForCausalLM
    if p.arch == "gemma2":
        from transformers import Gemma2Config, Gemma2ForCausalLM

        scalar = p.hidden_size // p.num_heads if p.head_dim == 128 else p.head_dim
        return Gemma2Config(**common, query_pre_attn_scalar=scalar), Gemma2ForCausalLM
    raise ValueError(f"unknown architecture {p.arch}")


def decoder_layers(model) -> list[torch.nn.Module]:
    return list(model.model.layers)


def ac_apply(model, interval: int) -> None:
    """Checkpoint every ``interval``-th decoder layer (0: none, 1: all): its activations
    are recomputed in backward, the others kept. Counted as torchtitan counts (layers
    N-1, 2N-1, ...), through transformers' own per-layer flag, so FSDP2's hooks stay
    outside the checkpoint and the parameter names do not change."""
    if interval < 1:
        return
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    for i, layer in enumerate(decoder_layers(model)):
        layer.gradient_checkpointing = (i + 1) % interval == 0


def shard_units(model, mp) -> None:
    """FSDP2 units as torchtitan's ``parallelize_llama`` makes them: the embedding, each
    decoder layer, then the final norm with the output projection, then the root (which
    holds what is left: the rotary buffers). Every unit but the last is resharded after
    its forward (its weights are gathered again for backward): the norm+lm_head unit
    runs last in forward and first in backward, so resharding it would only all-gather
    it again at once; the root is never resharded after forward in FSDP2.

    Tied embeddings (Gemma; Llama 3.2): a parameter can live in one unit only, and the
    shared weight is used first (lookup) and last (projection), so the embedding, norm
    and lm_head stay together in the root, which is gathered for the whole step (it is
    the first used in forward and the last done in backward)."""
    from torch.distributed.fsdp import fully_shard

    inner = model.model
    tied = model.lm_head.weight is inner.embed_tokens.weight or bool(
        getattr(model.config, "tie_word_embeddings", False)
    )
    if not tied:
        fully_shard(inner.embed_tokens, mp_policy=mp, reshard_after_forward=True)
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=mp, reshard_after_forward=True)
    if not tied:
        fully_shard([inner.norm, model.lm_head], mp_policy=mp, reshard_after_forward=False)
    fully_shard(model, mp_policy=mp)


def model_build(
    p: Preset,
    *,
    d,
    seed: int,
    precision: str,
    activation_checkpointing: bool | int | str,
    compile: bool,
    hf: dict | None = None,
):
    """The model, sharded when the job has more than one process, initialised from seed.
    ``hf``: a Hugging Face config.json's contents, the model's config instead of the
    preset's (init_from a Hugging Face directory; its weights are loaded afterwards)."""
    if hf is not None:
        from .hf import hf_model_class

        config, cls = hf_model_class(hf)
        config.use_cache = False
    else:
        config, cls = hf_config(p)
    # Gemma 2's logit soft-capping is not in SDPA; its authors train it with eager attention.
    attn = "eager" if p.arch == "gemma2" else "sdpa"
    config._attn_implementation = attn
    with torch.device("meta"):
        model = cls(config)
    ac_apply(model, ac_interval(activation_checkpointing))
    if d.enabled:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        mp = MixedPrecisionPolicy()
        if precision == "bf16":
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        shard_units(model, mp)
    model.to_empty(device=d.device)
    torch.manual_seed(seed)
    with torch.no_grad(), warnings.catch_warnings():
        # Weight init on CPU DTensors works (the runtime tests run it); the warning is generic.
        warnings.filterwarnings("ignore", message="DTensor random operators may not have")
        model.init_weights()  # also recomputes the rotary buffers left empty by to_empty
    if compile:
        for layer in decoder_layers(model):
            layer.compile()
    model.train()
    return model


def autocast(d, precision: str):
    """bf16 autocast for a single unsharded process; FSDP2 casts by itself."""
    if precision == "bf16" and not d.enabled:
        return torch.autocast(device_type=d.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def lm_loss_sum(model, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross-entropy; ``labels`` align with ``input_ids`` (as in
    transformers) and -100 marks positions that do not count. Chunked over the sequence
    (``loss.chunked_ce_sum``): no fp32 logits for the whole sequence."""
    from .loss import chunked_ce_sum, final_hidden

    # Shift the labels, not the hidden states: the last position predicts nothing.
    target = F.pad(labels[:, 1:], (0, 1), value=-100)
    return chunked_ce_sum(model, final_hidden(model, input_ids), target)


def lm_loss_sum_full(model, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The same loss from the whole (batch, seq, vocab) fp32 logits: the reference the
    chunked one is tested against."""
    logits = model(input_ids=input_ids, use_cache=False).logits.float()
    target = F.pad(labels[:, 1:], (0, 1), value=-100)
    return F.cross_entropy(
        logits.view(-1, logits.size(-1)), target.reshape(-1), ignore_index=-100, reduction="sum"
    )


def flops_per_token(p: Preset, seq_len: int) -> float:
    """Training FLOPs per token, PaLM appendix B: 6·N + 12·n_layers·(n_heads·head_dim)·seq_len,
    N = parameters in matmuls (see the package docstring)."""
    return 6.0 * matmul_param_count(p) + 12.0 * p.num_layers * p.num_heads * p.head_dim * seq_len
