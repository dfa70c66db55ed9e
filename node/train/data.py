"""Offline text and the order samples are read in.

The default corpus is the Python standard library's own sources (every machine with
Python has them): a deterministic, bounded subset, files in sorted order. A run may
name a .txt file, a directory of text files, or a JSONL file (a "text" field, or
"prompt" + "response") instead.

Sample order is a pure function of (seed, step): sample i of step s is element
``(s - 1) * global_batch + i`` of an endless sequence of per-epoch permutations, so
a resumed run reads exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import sysconfig
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger("mtc.runtime")

SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idlelib"}


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        out.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return out


def _read_text(path: Path) -> str | None:
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if b"\0" in raw[:4096]:
        return None  # binary
    return raw.decode("utf-8", errors="replace")


def _jsonl_texts(path: Path) -> list[str]:
    texts = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError:
                log.warning("%s:%d: not JSON, skipped", path, n)
                continue
            if isinstance(row, dict) and isinstance(row.get("text"), str):
                texts.append(row["text"])
            elif isinstance(row, dict) and isinstance(row.get("prompt"), str):
                texts.append(row["prompt"] + str(row.get("response", row.get("answer", ""))))
    return texts


def corpus_texts(data_path: str | None, max_bytes: int) -> list[str]:
    """Documents of the corpus, in a fixed order, at most ``max_bytes`` characters in all."""
    if data_path is None:
        files = stdlib_files()
    else:
        p = Path(data_path)
        if not p.exists():
            raise FileNotFoundError(f"data_path {data_path} does not exist")
        if p.is_file() and p.suffix == ".jsonl":
            return _bounded(_jsonl_texts(p), max_bytes, data_path)
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    texts: list[str] = []
    total = 0
    for f in files:
        text = _read_text(f)
        if text:
            texts.append(text)
            total += len(text)
        if total >= max_bytes:
            break
    return _bounded(texts, max_bytes, data_path or "the Python standard library")


def _bounded(texts: list[str], max_bytes: int, what: str) -> list[str]:
    out, total = [], 0
    for t in texts:
        if total + len(t) > max_bytes:
            out.append(t[: max_bytes - total])
            log.debug("corpus: read the first %d characters of %s (corpus_bytes)", max_bytes, what)
            break
        out.append(t)
        total += len(t)
    if not any(out):
        raise ValueError(f"no text found in {what}")
    return [t for t in out if t]


def corpus_key(data_path: str | None, max_bytes: int, tokenizer_fp: str) -> str:
    """Names the token cache. Built from the *request*, not the files, so a requeued job
    reuses the tokens its first attempt cached even if the node's Python differs."""
    raw = json.dumps([data_path, max_bytes, tokenizer_fp]).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def tokens_build(texts: list[str], encode_batch, eos_id: int, vocab_size: int) -> np.ndarray:
    dtype = np.uint16 if vocab_size <= 65535 else np.uint32
    parts = []
    for ids in encode_batch(texts):
        parts.append(np.asarray(ids, dtype=dtype))
        parts.append(np.asarray([eos_id], dtype=dtype))
    return np.concatenate(parts)


def tokens_save(arr: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as fh:
        np.save(fh, arr)
    os.replace(tmp, path)


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
