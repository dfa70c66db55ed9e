"""Pretraining (llama-pretrain, gemma-pretrain, continued-pretrain): next-token loss on
fixed-length windows of the tokenized corpus. Window k is tokens[k·L : (k+1)·L];
labels are the inputs (transformers' convention), so each window gives L-1 predictions."""

from __future__ import annotations

import logging

import numpy as np
import torch

from .data import corpus_key, corpus_texts, sample_ids, tokens_build, tokens_save
from .model import lm_loss_sum

log = logging.getLogger("mtc.runtime")


def pretrain_tokens(cfg, d, tok) -> np.ndarray:
    """The corpus as one token array, cached under run_dir/data/ by rank 0 (a requeued
    job and the other ranks read the cache)."""
    key = corpus_key(cfg.data_path, cfg.corpus_bytes, tok.fingerprint())
    path = cfg.path / "data" / f"tokens-{key}.npy"
    if d.is_main and not path.exists():
        texts = corpus_texts(cfg.data_path, cfg.corpus_bytes)
        arr = tokens_build(texts, tok.encode_batch, tok.eos_id, tok.vocab_size)
        tokens_save(arr, path)
        log.info("corpus: %d documents, %d tokens -> %s", len(texts), len(arr), path)
    d.barrier()
    return np.load(path, mmap_mode="r")


class PretrainTask:
    def __init__(self, cfg, d, tokens: np.ndarray):
        self.cfg, self.d, self.tokens = cfg, d, tokens
        self.seq_len = cfg.seq_len
        self.n = len(tokens) // self.seq_len
        if self.n < 1:
            raise ValueError(f"the corpus has {len(tokens)} tokens, fewer than seq_len")
        self.first, self.count = d.share(cfg.global_batch)
        self.micro = cfg.micro_batch or self.count

    def prepare(self, model, step: int):
        ids = sample_ids(self.cfg.seed, step, self.cfg.global_batch, self.n, self.first, self.count)
        L = self.seq_len
        rows = np.stack([np.asarray(self.tokens[k * L : (k + 1) * L]) for k in ids])
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
