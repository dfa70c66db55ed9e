"""The order samples are read in, and the name of a corpus's token cache.

The corpus itself (formats, streaming) is ``corpus``; tokens on disk are ``shards``.

Sample order is a pure function of (seed, step): sample i of step s is element
``(s - 1) * global_batch + i`` of an endless sequence of per-epoch permutations, so
a resumed run reads exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import functools
import hashlib
import json

import numpy as np
import torch

STDLIB_CHARS = 2_000_000  # the default corpus is a demo: its first 2 M characters


def corpus_key(data_path: str | None, max_chars: int | None, field: str, tokenizer_fp: str) -> str:
    """Names the token cache. Built from the *request*, not the files, so a requeued job
    reuses the tokens its first attempt cached even if the node's Python differs."""
    raw = json.dumps(["tokens-2", data_path, max_chars, field, tokenizer_fp]).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


@functools.lru_cache(maxsize=4)
def _epoch_perm(seed: int, epoch: int, n: int) -> np.ndarray:
    g = torch.Generator().manual_seed((seed * 1_000_003 + epoch * 7919) % (2**63))
    return torch.randperm(n, generator=g).numpy()


def sample_ids(seed: int, step: int, global_batch: int, n: int, start: int, count: int):
    """Indices in [0, n) of samples ``start .. start+count-1`` of step ``step`` (1-based)."""
    c = (step - 1) * global_batch + np.arange(start, start + count)
    epochs, pos = c // n, c % n
    out = np.empty(count, dtype=np.int64)
    for epoch in np.unique(epochs):
        sel = epochs == epoch
        out[sel] = _epoch_perm(seed, int(epoch), n)[pos[sel]]
    return out.tolist()


def step_generator(seed: int, step: int, salt: int = 0) -> torch.Generator:
    """A generator for step ``step`` alone (generated tasks, RL sampling)."""
    return torch.Generator().manual_seed((seed * 1_000_003 + step * 7919 + salt * 104729) % 2**63)
