"""Pretraining (llama-pretrain, gemma-pretrain, continued-pretrain): next-token loss on
fixed-length windows of the tokenized corpus. Window k is tokens[k·L : (k+1)·L];
labels are the inputs (transformers' convention), so each window gives L-1 predictions."""

from __future__ import annotations

import logging

import numpy as np
import torch

from .data import STDLIB_CHARS, corpus_key, sample_ids
from .model import lm_loss_sum
from .shards import TokenShards, cache_build, is_shard_set, shards_open

log = logging.getLogger("mtc.runtime")


def pretrain_tokens(cfg, d, tok) -> TokenShards:
    """The corpus as tokens: a shard set as it is, else tokenized into run_dir/data/
    by all ranks together before the first step (a requeued job reads the cache)."""
    if is_shard_set(cfg.data_path):
        shards = shards_open(cfg.data_path, tok.eos_id)
        what = "shard set"
    else:
        cap = cfg.corpus_bytes
        if cap is None and cfg.data_path is None:
            cap = STDLIB_CHARS
        key = corpus_key(cfg.data_path, cap, cfg.text_field, tok.fingerprint())
        shards = cache_build(
            cfg.path / "data" / f"tokens-{key}",
            d.rank,
            d.world,
            tok,
            cfg.data_path,
            cfg.text_field,
            cap,
        )
        what = "corpus" if cap is None else f"corpus, its first {cap} characters (corpus_bytes)"
    if cfg.data_path and cfg.corpus_bytes is not None:  # a cap the user asked for: said loudly
        log.warning(
            "data: corpus_bytes %d caps what is read of %s", cfg.corpus_bytes, cfg.data_path
        )
    log.info(
        "data: %s documents, %d tokens of %s (%s)",
        shards.documents,
        len(shards),
        cfg.data_path or "the Python standard library",
        what,
    )
    return shards


class PretrainTask:
    def __init__(self, cfg, d, tokens: TokenShards):
        self.cfg, self.d, self.tokens = cfg, d, tokens
        self.seq_len = cfg.seq_len
        self.n = len(tokens) // self.seq_len
        if self.n < 1:
            raise ValueError(f"the corpus has {len(tokens)} tokens, fewer than seq_len")
        self.first, self.count, self.micro = d.micro_share(cfg.global_batch, cfg.micro_batch)

    def prepare(self, model, step: int):
        ids = sample_ids(self.cfg.seed, step, self.cfg.global_batch, self.n, self.first, self.count)
        L = self.seq_len
        rows = np.stack([self.tokens.window(k, L) for k in ids])
        x = torch.from_numpy(rows.astype(np.int64)).to(self.d.device)
        mbs = []
        for i in range(0, len(x), self.micro):
            chunk = x[i : i + self.micro]
            mbs.append(
                {"input_ids": chunk, "weight": chunk.size(0) * (L - 1), "tokens": chunk.numel()}
            )
        return mbs, {}

    def loss(self, model, mb) -> torch.Tensor:
        return lm_loss_sum(model, mb["input_ids"], mb["input_ids"])
