"""GRPO (group relative policy optimisation) with a verifiable reward.

Each step takes ``global_batch`` prompts (split over ranks), samples ``group_size``
completions of at most ``max_new_tokens`` tokens for each, and scores them: reward 1
when the completion (up to ``<eos>``) is exactly the answer, else 0 — no partial
credit. Advantages are group-relative: (r - mean(group)) / (std(group) + 1e-4), so a
group whose samples all score the same teaches nothing. The objective per completion
token is PPO's clipped surrogate ``min(ρ·A, clip(ρ, 1-ε, 1+ε)·A)`` minus
``kl_coef · KL(π || π_ref)`` (the k3 estimator, π_ref the policy the run started from),
averaged over each completion's tokens and then over completions.

One optimizer step per batch of samples (on-policy), so the sampling policy is the
current one and ρ = exp(logπ - stop_grad(logπ)) = 1 in value; its gradient is the
policy gradient. Generation recomputes the whole sequence for every new token (no KV
cache) and always runs ``max_new_tokens`` forwards, so every FSDP rank makes the same
collective calls.
"""

from __future__ import annotations

import torch

from .tasks import PairSource


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.cumsum(-1) - 1).clamp(min=0)


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
):
    """Left-padded prompts + sampled completions: (ids, attention mask, completion mask)."""
    width = max(len(p) for p in prompts)
    n = len(prompts)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    comp = torch.zeros_like(mask)
    done = torch.zeros(n, dtype=torch.bool, device=device)
    for _ in range(max_new_tokens):
        logits = (
            model(
                input_ids=ids, attention_mask=mask, position_ids=_positions(mask), use_cache=False
            )
            .logits[:, -1]
            .float()
        )
        probs = torch.softmax(logits / max(temperature, 1e-5), dim=-1)
        nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        live = (~done).long()
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        mask = torch.cat([mask, live[:, None]], dim=1)
        comp = torch.cat([comp, live[:, None]], dim=1)
        done |= nxt == eos_id
    return ids, mask, comp


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

    def prepare(self, model, step: int):
        cfg, tok, G = self.cfg, self.tok, self.group
        pairs = self.source.for_step(step, cfg.global_batch, self.first, self.count)
        prompts = [[tok.bos_id, *tok.encode(p)][-cfg.seq_len :] for p, _ in pairs]
        gen = torch.Generator(device=self.d.device)
        gen.manual_seed((cfg.seed * 1_000_003 + step * 7919 + self.d.rank * 104729) % 2**63)
        mbs, reward_sum, n = [], 0.0, 0
        for i in range(0, len(pairs), self.micro):
            chunk = pairs[i : i + self.micro]
            rows = [p for p in prompts[i : i + self.micro] for _ in range(G)]
            ids, mask, comp = generate(
                model,
                rows,
                max_new_tokens=cfg.rl.max_new_tokens,
                temperature=cfg.rl.temperature,
                pad_id=tok.pad_id,
                eos_id=tok.eos_id,
                gen=gen,
                device=self.d.device,
            )
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
                "weight": len(rows),
                "tokens": int(mask.sum()),
            }
            if self.ref is not None and cfg.rl.kl_coef > 0:
                with torch.no_grad():
                    mb["ref_logp"] = token_logprobs(self.ref, ids, mask)
            mbs.append(mb)
        return mbs, {"reward_sum": reward_sum, "reward_n": n}

    def loss(self, model, mb) -> torch.Tensor:
        logp = token_logprobs(model, mb["ids"], mb["mask"])
        loss, kl = grpo_loss_sum(
            logp,
            logp.detach(),
            mb["adv"],
            mb["tmask"],
            clip_eps=self.cfg.rl.clip_eps,
            ref_logp=mb.get("ref_logp"),
            kl_coef=self.cfg.rl.kl_coef,
        )
        if kl is not None:
            mb["kl_sum"] = float(kl.sum())
        return loss
