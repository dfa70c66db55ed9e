"""Tasks with checkable answers: generated arithmetic ("12+7=" → "19"), or a user's JSONL
of {"prompt", "response"} (SFT) / {"prompt", "answer"} (RL; "response" also read)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from .data import sample_ids, step_generator

log = logging.getLogger("mtc.runtime")


def arithmetic(gen: torch.Generator, count: int, max_operand: int) -> list[tuple[str, str]]:
    ab = torch.randint(0, max_operand + 1, (count, 2), generator=gen).tolist()
    return [(f"{a}+{b}=", str(a + b)) for a, b in ab]


def pairs_load(path: str) -> list[tuple[str, str]]:
    pairs = []
    with open(Path(path), encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                log.warning("%s:%d: not JSON, skipped", path, n)
                continue
            answer = row.get("response", row.get("answer")) if isinstance(row, dict) else None
            if not isinstance(row.get("prompt") if isinstance(row, dict) else None, str) or (
                answer is None
            ):
                log.warning("%s:%d: needs 'prompt' and 'response' (or 'answer'), skipped", path, n)
                continue
            pairs.append((row["prompt"], str(answer)))
    if not pairs:
        raise ValueError(f"{path}: no prompt/response pairs")
    return pairs


class PairSource:
    """(prompt, answer) pairs for a step: generated, or drawn from a JSONL file in the
    seed's order. Pure function of (seed, step, which samples)."""

    def __init__(self, data_path: str | None, seed: int, max_operand: int, salt: int):
        self.pairs = pairs_load(data_path) if data_path else None
        self.seed, self.max_operand, self.salt = seed, max_operand, salt

    def for_step(self, step: int, global_count: int, start: int, count: int):
        if self.pairs is None:
            gen = step_generator(self.seed, step, self.salt)
            return arithmetic(gen, global_count, self.max_operand)[start : start + count]
        ids = sample_ids(self.seed, step, global_count, len(self.pairs), start, count)
        return [self.pairs[i] for i in ids]

    def tokenizer_texts(self) -> list[str]:
        """Text to train a tokenizer on when no earlier run's tokenizer is given."""
        if self.pairs is not None:
            return [p + " " + a for p, a in self.pairs]
        gen = torch.Generator().manual_seed(self.seed)
        return [p + a for p, a in arithmetic(gen, 4000, self.max_operand)]
