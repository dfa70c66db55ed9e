"""GRPO (group relative policy optimisation) with a verifiable reward.

Each step takes ``global_batch`` prompts (split over ranks), samples ``group_size``
completions of at most ``max_new_tokens`` tokens for each, and scores them: reward 1
when the completion (up to ``<eos>``) is exactly the answer, else 0 — no partial
credit. Advantages are group-relative: (r - mean(group)) / (std(group) + 1e-4), so a
group whose samples all score the same teaches nothing. The objective per completion
token is PPO's clipped surrogate ``min(ρ·A, clip(ρ, 1-ε, 1+ε)·A)`` minus
``kl_coef · KL(π || π_ref)`` (the k3 estimator, π_ref the policy the run started from),
averaged over each completion's tokens and then over completions.

Each batch of samples is used for ``ppo_epochs`` consecutive optimizer steps (one
update per step, as TRL's ``num_iterations``): a fresh batch is sampled at steps 1,
1+E, 1+2E, ... and reused by the E-1 steps after it, so ``steps`` counts updates and a
run sees steps/E batches. ρ = exp(logπ - logπ_old) uses the log-probs recorded right
after sampling (old policy, no grad), so from the 2nd update on ρ ≠ 1 and ``clip_eps``
clips. With E = 1 the sampling policy is the current one: ρ = exp(logπ - stop_grad(logπ))
= 1 in value and its gradient is the policy gradient (no extra forward). A run resumed
in the middle of a batch's updates samples that batch again from the resumed policy
(the batch is not in the checkpoint).

Rollouts use KV-cache generation on an unsharded copy of the policy (rollout.py).
"""

from __future__ import annotations

import logging

import torch

from .model import autocast
from .rollout import _positions, generate, rollout_model
from .tasks import PairSource

log = logging.getLogger("mtc.runtime")


def completion_text(tok, ids: list[int]) -> str:
    out = []
    for t in ids:
        if t == tok.eos_id:
            break
        out.append(t)
    return tok.decode(out)


def reward(text: str, answer: str) -> float:
    return 1.0 if text.strip() == answer.strip() else 0.0


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """rewards [prompts, group] → advantages of the same shape."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=False)
    return (rewards - mean) / (std + 1e-4)


def token_logprobs(model, ids, mask) -> torch.Tensor:
    logits = (
        model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask), use_cache=False)
        .logits[:, :-1]
        .float()
    )
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def grpo_loss_sum(
    logp, old_logp, adv, tmask, *, clip_eps: float, ref_logp=None, kl_coef: float = 0.0
):
    """Sum over completions of the negated per-token objective, averaged per completion."""
    ratio = torch.exp(logp - old_logp)
    a = adv[:, None]
    surrogate = torch.minimum(ratio * a, ratio.clamp(1 - clip_eps, 1 + clip_eps) * a)
    per_token = -surrogate
    kl = None
    if ref_logp is not None and kl_coef > 0:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + kl_coef * kl
    lengths = tmask.sum(dim=1).clamp(min=1)
    per_seq = (per_token * tmask).sum(dim=1) / lengths
    kl_seq = None if kl is None else ((kl * tmask).sum(dim=1) / lengths).detach()
    return per_seq.sum(), kl_seq


class RLTask:
    def __init__(self, cfg, d, tok, ref_model=None):
        self.cfg, self.d, self.tok, self.ref = cfg, d, tok, ref_model
        self.source = PairSource(cfg.data_path, cfg.seed, cfg.max_operand, salt=2)
        # prompts: this rank's share and how many per micro-batch
        self.first, self.count, self.micro = d.micro_share(cfg.global_batch, cfg.micro_batch)
        self.group = cfg.rl.group_size
        self.epochs = cfg.rl.ppo_epochs
        self.precision = cfg.precision
        if self.precision == "auto":
            self.precision = "bf16" if d.device.type == "cuda" else "fp32"
        self._batch: tuple[int, list, dict] | None = None  # (first step, mbs, extra)
        self._mode = ""  # how the last rollout ran, logged when it changes

    def prepare(self, model, step: int):
        first = step - (step - 1) % self.epochs  # the step that sampled this batch
        if self._batch is None or self._batch[0] != first:
            self._batch = None  # free the previous batch before sampling the next
            self._batch = (first, *self._sample(model, first))
        return self._batch[1], self._batch[2]

    def _sample(self, model, step: int):
        cfg, tok, G, d = self.cfg, self.tok, self.group, self.d
        pairs = self.source.for_step(step, cfg.global_batch, self.first, self.count)
        prompts = [[tok.bos_id, *tok.encode(p)][-cfg.seq_len :] for p, _ in pairs]
        gen = torch.Generator(device=d.device)
        gen.manual_seed((cfg.seed * 1_000_003 + step * 7919 + d.rank * 104729) % 2**63)
        mbs, reward_sum, n = [], 0.0, 0
        # FSDP2 computes in bf16 when asked (its mixed precision): the copy matches it.
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32
        length = max(map(len, prompts), default=1) + cfg.rl.max_new_tokens
        rollout = rollout_model(model, d, dtype=dtype, rows=self.micro * G, length=length)
        with rollout as (policy, unsharded), autocast(d, self.precision):
            mode = "unsharded" if unsharded or not d.enabled else "sharded (no room for a copy)"
            if mode != self._mode:
                log.info("rl rollouts: KV cache, %s policy", mode)
                self._mode = mode
            samples = []
            for i in range(0, len(pairs), self.micro):
                rows = [p for p in prompts[i : i + self.micro] for _ in range(G)]
                samples.append(
                    generate(
                        policy,
                        rows,
                        max_new_tokens=cfg.rl.max_new_tokens,
                        temperature=cfg.rl.temperature,
                        pad_id=tok.pad_id,
                        eos_id=tok.eos_id,
                        gen=gen,
                        device=d.device,
                        fixed_length=not unsharded,
                    )
                )
        for i, (ids, mask, comp) in zip(range(0, len(pairs), self.micro), samples, strict=True):
            chunk = pairs[i : i + self.micro]
            width = ids.size(1) - cfg.rl.max_new_tokens
            texts = [completion_text(tok, row[width:]) for row in ids.tolist()]
            r = torch.tensor(
                [reward(t, chunk[j // G][1]) for j, t in enumerate(texts)], dtype=torch.float32
            )
            reward_sum += float(r.sum())
            n += len(texts)
            adv = group_advantages(r.view(len(chunk), G)).view(-1).to(self.d.device)
            mb = {
                "ids": ids,
                "mask": mask,
                "tmask": comp[:, 1:].float(),
                "adv": adv,
                "weight": ids.size(0),
                "tokens": int(mask.sum()),
            }
            if self.ref is not None and cfg.rl.kl_coef > 0:
                with torch.no_grad():
                    mb["ref_logp"] = token_logprobs(self.ref, ids, mask)
            if self.epochs > 1:  # π_old: the policy that sampled, as the loss computes it
                with torch.no_grad(), autocast(d, self.precision):
                    mb["old_logp"] = token_logprobs(model, ids, mask)
            mbs.append(mb)
        return mbs, {"reward_sum": reward_sum, "reward_n": n}

    def loss(self, model, mb) -> torch.Tensor:
        logp = token_logprobs(model, mb["ids"], mb["mask"])
        loss, kl = grpo_loss_sum(
            logp,
            mb.get("old_logp", logp.detach()),
            mb["adv"],
            mb["tmask"],
            clip_eps=self.cfg.rl.clip_eps,
            ref_logp=mb.get("ref_logp"),
            kl_coef=self.cfg.rl.kl_coef,
        )
        if kl is not None:
            mb["kl_sum"] = float(kl.sum())
        return loss
