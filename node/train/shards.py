"""Tokens on disk: pre-tokenized shard sets and the run's own token cache.

A shard set is a directory of flat token arrays read as memmaps, the format large
runs use: ``.bin`` (raw little-endian integers, nanoGPT's layout) or ``.npy`` files,
in sorted order, each document followed by the tokenizer's end-of-sequence token.
``python -m node.train.shards tokenize`` (``mtc data tokenize``) writes one with
``shards.json`` (dtype, per-shard tokens and documents) and the ``tokenizer.json`` it
used; a run whose ``data_path`` is a shard set trains with that tokenizer. Shards
from elsewhere need a ``tokenizer.json`` beside them; ``.bin`` without ``shards.json``
is read as uint16, and their documents are counted as end-of-sequence tokens.

A raw corpus is tokenized by the run itself before its first step: every rank takes
every world-th unit of ``corpus.corpus_units`` and writes it as one part of the cache
in run_dir/data/; then each waits *on the files* until all parts are there. No rank
waits in a collective (whose timeout a large corpus would pass), and a requeued job
keeps the parts its first attempt finished.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from .corpus import TOKEN_FILES, corpus_documents, corpus_units, unit_documents

log = logging.getLogger("mtc.runtime")
MANIFEST = "shards.json"
FORMAT = "mtc-tokens-1"
ENCODE_BATCH = 512  # documents per encode_batch call (the Rust side uses every core)
WAIT_POLL_S, WAIT_SAY_S = 0.2, 30.0


def token_dtype(vocab_size: int):
    return np.uint16 if vocab_size <= 65535 else np.uint32


def is_shard_set(data_path: str | None) -> bool:
    """A shard set: a token file, or a directory with shards.json or with token files
    and no document it could read instead."""
    if data_path is None:
        return False
    p = Path(data_path)
    if p.is_file():
        return p.suffix in TOKEN_FILES
    if not p.is_dir():
        return False
    if (p / MANIFEST).exists():
        return True
    names = [f.suffix for f in p.iterdir() if f.is_file() and not f.name.startswith(".")]
    return any(s in TOKEN_FILES for s in names) and all(
        s in TOKEN_FILES or s == ".json" for s in names
    )


class TokenShards:
    """Flat token arrays read as one sequence; window k is tokens[k·L : (k+1)·L]."""

    def __init__(self, arrays: list[np.ndarray], documents: int | None = None):
        self.arrays = [a for a in arrays if len(a)]
        self.bounds = np.cumsum([0] + [len(a) for a in self.arrays])
        self.documents = documents

    def __len__(self) -> int:
        return int(self.bounds[-1])

    def window(self, k: int, length: int) -> np.ndarray:
        lo, hi = k * length, (k + 1) * length
        i = int(np.searchsorted(self.bounds, lo, side="right")) - 1
        parts = []
        while lo < hi and i < len(self.arrays):
            a, base = self.arrays[i], int(self.bounds[i])
            take = a[lo - base : min(hi, base + len(a)) - base]
            parts.append(np.asarray(take))
            lo += len(take)
            i += 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def count(self, token: int) -> int:
        n = 0
        for a in self.arrays:
            for i in range(0, len(a), 1 << 24):
                n += int(np.count_nonzero(a[i : i + (1 << 24)] == token))
        return n


def _open_array(path: Path, dtype) -> np.ndarray:
    if path.suffix == ".npy":
        return np.load(path, mmap_mode="r")
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def shards_open(data_path: str, eos_id: int | None = None) -> TokenShards:
    """A shard set, whole. Documents come from shards.json, else are counted as
    ``eos_id`` tokens (None when neither is known)."""
    p = Path(data_path)
    manifest = None
    if p.is_dir() and (p / MANIFEST).exists():
        manifest = json.loads((p / MANIFEST).read_text())
    if manifest is not None:
        dtype = np.dtype(manifest.get("dtype", "uint16"))
        files = [p / s["file"] for s in manifest["shards"]]
    else:
        dtype = np.dtype(np.uint16)
        files = [p] if p.is_file() else sorted(f for f in p.iterdir() if f.suffix in TOKEN_FILES)
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise FileNotFoundError(f"shards listed in {MANIFEST} are missing: {', '.join(missing)}")
    shards = TokenShards([_open_array(f, dtype) for f in files])
    if manifest is not None and "documents" in manifest:
        shards.documents = int(manifest["documents"])
    elif eos_id is not None:
        shards.documents = shards.count(eos_id)
    return shards


def _encode(
    docs: Iterable[str], encode_batch, eos_id: int, dtype
) -> Iterator[tuple[np.ndarray, int]]:
    """(tokens with an end-of-sequence after each document, documents) per batch."""
    batch: list[str] = []

    def flush():
        ids = encode_batch(batch)
        flat = [t for row in ids for t in (*row, eos_id)]
        return np.asarray(flat, dtype=dtype), len(batch)

    for doc in docs:
        batch.append(doc)
        if len(batch) >= ENCODE_BATCH:
            yield flush()
            batch = []
    if batch:
        yield flush()


def _write_atomic(path: Path, chunks: Iterable[np.ndarray]) -> int:
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    n = 0
    with open(tmp, "wb") as fh:
        for c in chunks:
            c.tofile(fh)
            n += len(c)
    os.replace(tmp, path)
    return n


def _write_part(cache: Path, index: int, docs: Iterable[str], tok, eos_last: bool) -> None:
    """One cache part: part-N.bin, then part-N.json (its presence means "done")."""
    dtype = token_dtype(tok.vocab_size)
    counted = {"documents": 0}

    def chunks():
        for arr, n in _encode(docs, tok.encode_batch, tok.eos_id, dtype):
            counted["documents"] += n
            yield arr if eos_last else arr[:-1]  # a text file's middle range: no eos yet

    tokens = _write_atomic(cache / f"part-{index:06d}.bin", chunks())
    meta = {"tokens": tokens, "documents": counted["documents"] if eos_last else 0}
    tmp = cache / f"part-{index:06d}.json.tmp{os.getpid()}"
    tmp.write_text(json.dumps({**meta, "dtype": np.dtype(dtype).name}))
    os.replace(tmp, cache / f"part-{index:06d}.json")


def cache_build(
    cache: Path,
    rank: int,
    world: int,
    tok,
    data_path: str | None,
    field: str,
    max_chars: int | None,
) -> TokenShards:
    """The corpus tokenized into ``cache`` (parts shared out over the ranks), opened.
    With ``max_chars`` the corpus is one sequential stream, a single part (rank 0's)."""
    cache.mkdir(parents=True, exist_ok=True)
    if max_chars is not None:
        work: list[Callable[[], None]] = [
            lambda: _write_part(
                cache, 0, corpus_documents(data_path, field, max_chars), tok, eos_last=True
            )
        ]
    else:
        units = corpus_units(data_path, field)
        work = [
            (lambda i=i, u=u: _write_part(cache, i, unit_documents(u, field), tok, u.last))
            for i, u in enumerate(units)
        ]
    done = lambda i: (cache / f"part-{i:06d}.json").exists()  # noqa: E731
    t0 = time.time()
    mine = [i for i in range(rank, len(work), world) if not done(i)]
    for i in mine:
        work[i]()
    if mine:
        log.info(
            "corpus: tokenized %d of %d parts in %.1fs", len(mine), len(work), time.time() - t0
        )
    said = time.monotonic()
    while not all(done(i) for i in range(len(work))):
        if time.monotonic() - said > WAIT_SAY_S:
            have = sum(done(i) for i in range(len(work)))
            log.info("corpus: waiting for the other ranks' parts (%d of %d done)", have, len(work))
            said = time.monotonic()
        time.sleep(WAIT_POLL_S)
    metas = [json.loads((cache / f"part-{i:06d}.json").read_text()) for i in range(len(work))]
    dtype = token_dtype(tok.vocab_size)
    arrays = [_open_array(cache / f"part-{i:06d}.bin", dtype) for i in range(len(work))]
    return TokenShards(arrays, documents=sum(m["documents"] for m in metas))


# --- mtc data tokenize ----------------------------------------------------------------


def shards_write(docs: Iterable[str], tok, out_dir: Path, shard_tokens: int = 100_000_000) -> dict:
    """Tokenize ``docs`` into a shard set in ``out_dir`` (shards of at most about
    ``shard_tokens`` tokens, cut between batches), with shards.json and tokenizer.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = token_dtype(tok.vocab_size)
    shards: list[dict] = []
    fh, current = None, None
    try:
        for arr, n in _encode(docs, tok.encode_batch, tok.eos_id, dtype):
            if fh is None or current["tokens"] >= shard_tokens:
                if fh is not None:
                    fh.close()
                current = {"file": f"shard-{len(shards):05d}.bin", "tokens": 0, "documents": 0}
                shards.append(current)
                fh = open(out_dir / current["file"], "wb")  # noqa: SIM115
            arr.tofile(fh)
            current["tokens"] += len(arr)
            current["documents"] += n
    finally:
        if fh is not None:
            fh.close()
    tok.save(out_dir / "tokenizer.json")
    manifest = {
        "format": FORMAT,
        "dtype": np.dtype(dtype).name,
        "eos_id": tok.eos_id,
        "vocab_size": tok.vocab_size,
        "tokenizer": tok.fingerprint(),
        "documents": sum(s["documents"] for s in shards),
        "tokens": sum(s["tokens"] for s in shards),
        "shards": shards,
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def tokenize_argparser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("input", help="text file or directory, JSONL, Parquet or Arrow")
    parser.add_argument("output", help="directory for the shards, shards.json, tokenizer.json")
    parser.add_argument(
        "--tokenizer",
        help="tokenizer.json to use (or a run directory holding one); "
        "default: train a byte-level BPE on the first 4 MB of the input",
    )
    parser.add_argument("--vocab", type=int, default=16384, help="vocabulary of a trained BPE")
    parser.add_argument("--field", default="text", help="the JSONL/Parquet text field")
    parser.add_argument("--shard-tokens", type=int, default=100_000_000)
    return parser


def tokenize_command(args: argparse.Namespace, out=None) -> dict:
    from .tokenizer import TOKENIZER_FILE, tokenizer_load, tokenizer_train

    if args.tokenizer:
        path = Path(args.tokenizer)
        tok = tokenizer_load(path / TOKENIZER_FILE if path.is_dir() else path)
    else:
        tok = tokenizer_train(corpus_documents(args.input, args.field, 4_000_000), args.vocab)
    t0 = time.time()
    manifest = shards_write(
        corpus_documents(args.input, args.field), tok, Path(args.output), args.shard_tokens
    )
    (out or sys.stdout).write(
        f"{manifest['documents']} documents, {manifest['tokens']} tokens in "
        f"{len(manifest['shards'])} shard(s) ({manifest['dtype']}) -> {args.output} "
        f"({time.time() - t0:.1f}s)\n"
    )
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m node.train.shards")
    verbs = parser.add_subparsers(dest="verb", required=True)
    tokenize_argparser(verbs.add_parser("tokenize", help="write a pre-tokenized shard set"))
    tokenize_command(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
