"""Will a recipe launch fit in its pool's GPU memory? An estimate per GPU under FSDP2
(every rank holds 1/ranks of the parameters, gradients and optimizer state) plus what
is not sharded (one layer's gathered weights and its gradient, twice for prefetch, the
activations of one micro-batch, one chunk of the loss's logits), against the GPU's
memory less headroom.
And how long before its time limit a run is warned (``signal_lead``): long enough to
save a checkpoint of that size.

Django-free: it reads the recipe parameters and the pool's GPU type and count.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from node.train.config import LOSS_CHUNK_TOKENS as CHUNK_TOKENS
from node.train.config import ac_interval
from node.train.presets import PRESETS, Preset, param_count

GB = 10**9
# Memory per GPU, bytes, by the spec's accelerator_type (Compute Engine's GPU names,
# upper case). Source: "GPU machine types", https://cloud.google.com/compute/docs/gpus
# (GPU memory per GPU, as Google states it: 141 GB HBM3e for H200, 180 GB for B200,
# 186 GB for GB200, 80 GB HBM3 for H100 and H100 Mega, 80/40 GB for A100, 24 GB for L4).
GPU_MEMORY: dict[str, int] = {
    "NVIDIA_GB200": 186 * GB,
    "NVIDIA_B200": 180 * GB,
    "NVIDIA_H200_141GB": 141 * GB,
    "NVIDIA_H100_MEGA_80GB": 80 * GB,
    "NVIDIA_H100_80GB": 80 * GB,
    "NVIDIA_A100_80GB": 80 * GB,
    "NVIDIA_TESLA_A100": 40 * GB,
    "NVIDIA_L4": 24 * GB,
}
# Left for the CUDA context, NCCL's buffers and the caching allocator's fragmentation.
HEADROOM = 0.10
# fp32 master weights (FSDP2 keeps the sharded parameters in fp32 under bf16 mixed
# precision), fp32 gradients, AdamW's two fp32 moments.
PARAM_BYTES, GRAD_BYTES, OPTIM_BYTES = 4, 4, 8
MAX_NODES = 4096  # where the search for a node count that fits gives up
_SIZE_IN_NAME = re.compile(r"_(\d{2,4})GB$")


def gpu_memory(accelerator_type: str) -> int | None:
    """Bytes per GPU of ``accelerator_type``; its ``_NNNGB`` suffix when not in the table."""
    if accelerator_type in GPU_MEMORY:
        return GPU_MEMORY[accelerator_type]
    m = _SIZE_IN_NAME.search(accelerator_type)
    return int(m.group(1)) * GB if m else None


@dataclass(frozen=True)
class Estimate:
    params: int  # bytes per GPU of each part
    grads: int
    optimizer: int
    working: int  # gathered layer weights and gradients, not sharded
    activations: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.working + self.activations

    def describe(self) -> str:
        parts = (
            ("parameters", self.params),
            ("gradients", self.grads),
            ("optimizer state", self.optimizer),
            ("gathered layers", self.working),
            ("activations", self.activations),
        )
        return ", ".join(f"{name} {b / GB:.1f}" for name, b in parts)


def _preset(family: str, model: str) -> Preset | None:
    for fam in (family, *PRESETS):
        if model in PRESETS.get(fam, {}):
            return PRESETS[fam][model]
    return None


def _layer_params(p: Preset) -> int:
    d, hd = p.hidden_size, p.head_dim
    return d * p.num_heads * hd * 2 + d * p.num_kv_heads * hd * 2 + 3 * d * p.intermediate_size


def estimate(p: Preset, params: dict[str, Any], ranks: int, *, reference: bool) -> Estimate:
    """Bytes per GPU for preset ``p`` on ``ranks`` GPUs with the recipe's parameters."""
    n = param_count(p)
    compute = 4 if params.get("precision") == "fp32" else 2  # bf16 on GPUs unless asked
    sharded = math.ceil(n / ranks)
    # One decoder layer gathered in the compute dtype with its unsharded gradient, and the
    # next one prefetched; the root (embeddings, output projection) is gathered too.
    root = p.vocab_size * p.hidden_size * (1 if p.tie_embeddings else 2)
    working = 2 * _layer_params(p) * (compute + 4) + root * compute
    share = max(1, (params.get("global_batch") or 1) // ranks)
    tokens = min(share, params.get("micro_batch") or share) * (params.get("seq_len") or 1)
    d, i = p.hidden_size, p.intermediate_size
    interval = ac_interval(params.get("activation_checkpointing"))
    # Saved for backward per token and layer (SDPA stores no attention matrix): the
    # norms' outputs, q/k/v, attention output, MLP input, gate/up/activation/product.
    per_layer = 6 * d + 2 * p.num_kv_heads * p.head_dim + 4 * i
    # Checkpointed layers (every interval-th, as the runtime picks them) keep only their
    # input, and one of them is recomputed at a time in backward.
    checkpointed = p.num_layers // interval if interval else 0
    kept = (p.num_layers - checkpointed) * per_layer + checkpointed * d
    act = tokens * compute * (kept + (per_layer if checkpointed else 0))
    # The loss runs lm_head over CHUNK_TOKENS tokens at a time: one chunk's logits, their
    # fp32 copy and its gradient, not the whole micro-batch's.
    act += min(tokens, CHUNK_TOKENS) * p.vocab_size * (compute + 4 + 4)
    return Estimate(
        params=sharded * PARAM_BYTES * (2 if reference else 1),  # rl: the frozen policy
        grads=sharded * GRAD_BYTES,
        optimizer=sharded * OPTIM_BYTES,
        working=working,
        activations=act,
    )


def memory_problem(
    *, family: str, params: dict[str, Any], nodes: int, gpus: int, accelerator: str
) -> str | None:
    """Why the launch cannot fit in ``nodes`` x ``gpus`` GPUs of ``accelerator`` (with
    the estimate and the smallest node count that fits), or None (it fits, or mtc
    knows too little to say: no GPUs, an unknown GPU or model)."""
    memory = gpu_memory(accelerator) if gpus else None
    p = _preset(family, str(params.get("model", "")))
    if memory is None or p is None:
        return None
    usable = int(memory * (1 - HEADROOM))
    reference = bool((params.get("kl_coef") or 0) > 0)
    need = estimate(p, params, nodes * gpus, reference=reference)
    if need.total <= usable:
        return None
    fits = next(
        (
            n
            for n in range(nodes + 1, MAX_NODES + 1)
            if estimate(p, params, n * gpus, reference=reference).total <= usable
        ),
        None,
    )
    advice = (
        f"{fits} nodes fit ({estimate(p, params, fits * gpus, reference=reference).total / GB:.1f}"
        " GB per GPU)."
        if fits
        else f"no node count up to {MAX_NODES} fits: lower micro_batch or seq_len, or set "
        'activation_checkpointing to "full".'
    )
    return (
        f"{p.name} needs about {need.total / GB:.1f} GB per GPU on {nodes} node(s) x {gpus} "
        f"{accelerator} ({need.describe()} GB), more than the "
        f"{usable / GB:.0f} GB usable of {memory / GB:.0f} GB; {advice}"
    )


# --- how long before the end a job is warned (sbatch --signal=USR1@<lead>) --------------
LEAD_FLOOR_S = 60  # finish the step in progress (seconds even for 70B) and start the save
# Per node, to the checkpoint storage: below the one rate measured, a 15 GB DCP save
# on one H200 node's local disk in 33 s (0.46 GB/s, bench/gpu_check.py); shared storage
# is rarely faster for one node.
WRITE_BYTES_PER_S = 0.4 * GB
LEAD_MAX_S = 3600
CHECKPOINT_BYTES_PER_PARAM = 12  # fp32 weights and AdamW's two fp32 moments


def signal_lead(*, family: str, model: str, nodes: int) -> int:
    """Seconds of warning a run needs to save a checkpoint: the floor plus this node's
    share of the checkpoint at WRITE_BYTES_PER_S (every node writes its ranks' shards)."""
    p = _preset(family, model)
    if p is None:
        return LEAD_FLOOR_S
    per_node = param_count(p) * CHECKPOINT_BYTES_PER_PARAM / max(nodes, 1)
    return min(LEAD_MAX_S, LEAD_FLOOR_S + int(per_node / WRITE_BYTES_PER_S))
