"""Supervised fine-tuning on (prompt, response) pairs, the loss on response tokens only.

One example is ``<bos> prompt response <eos>``; its labels equal the input ids except
-100 on ``<bos>`` and every prompt token (and on padding), so only the response and
its ``<eos>`` are learned. Right padding needs no attention mask: causal attention
never lets a real token see the padding after it."""

from __future__ import annotations

import torch

from .model import lm_loss_sum
from .tasks import PairSource

IGNORE = -100


def sft_example(tok, prompt: str, response: str, seq_len: int) -> tuple[list[int], list[int]]:
    p = [tok.bos_id, *tok.encode(prompt)]
    r = [*tok.encode(response), tok.eos_id]
    ids = (p + r)[:seq_len]
    labels = ([IGNORE] * len(p) + r)[:seq_len]
    return ids, labels


def sft_batch(tok, pairs, seq_len: int, device) -> dict:
    rows = [sft_example(tok, p, r, seq_len) for p, r in pairs]
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), tok.pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for i, (a, b) in enumerate(rows):
        ids[i, : len(a)] = torch.tensor(a)
        labels[i, : len(b)] = torch.tensor(b)
    return {
        "input_ids": ids.to(device),
        "labels": labels.to(device),
        "weight": int((labels[:, 1:] != IGNORE).sum()),
        "tokens": int(sum(len(a) for a, _ in rows)),
    }


class SFTTask:
    def __init__(self, cfg, d, tok):
        self.cfg, self.d, self.tok = cfg, d, tok
        self.source = PairSource(cfg.data_path, cfg.seed, cfg.max_operand, salt=1)
        self.first, self.count, self.micro = d.micro_share(cfg.global_batch, cfg.micro_batch)

    def prepare(self, model, step: int):
        pairs = self.source.for_step(step, self.cfg.global_batch, self.first, self.count)
        mbs = [
            sft_batch(self.tok, pairs[i : i + self.micro], self.cfg.seq_len, self.d.device)
            for i in range(0, len(pairs), self.micro)
        ]
        return mbs, {}

    def loss(self, model, mb) -> torch.Tensor:
        return lm_loss_sum(model, mb["input_ids"], mb["labels"])
