"""Pretraining data read whole, in its formats: a 5 MB JSONL (a chosen field), Parquet,
Arrow, a directory of JSONL shards, and pre-tokenized shard sets (written by
``mtc data tokenize``'s code and by hand as .npy). The run says what it read in its
start event (``dataset_documents``, ``dataset_tokens``)."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from node.train import shards as shards_mod
from node.train.corpus import corpus_documents, corpus_units
from node.train.shards import cache_build, shards_open, shards_write, tokenize_argparser
from node.train.tokenizer import tokenizer_train

from .test_runtime_train import read_metrics, run_inprocess

WORDS = "the model reads every line of data and learns what comes next in it".split()
TINY = {
    "steps": 1,
    "checkpoint_interval": 0,
    "global_batch": 2,
    "seq_len": 32,
    "warmup_steps": 0,
    "corpus_bytes": None,
    "tokenizer_vocab": 300,
}


def docs(n: int, words: int = 8, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [f"{i} " + " ".join(rng.choices(WORDS, k=words)) for i in range(n)]


def started(run_dir: Path) -> dict:
    _, events = read_metrics(run_dir)
    return next(e for e in events if e["event"] == "start")


@pytest.fixture(scope="module")
def tok():
    return tokenizer_train(docs(200), 300)


def test_a_5mb_jsonl_is_read_whole_from_the_chosen_field(tmp_path):
    texts = docs(20_000, words=42)
    path = tmp_path / "big.jsonl"
    with open(path, "w") as fh:
        for i, t in enumerate(texts):
            fh.write(json.dumps({"id": i, "body": t, "text": "not this"}) + "\n")
    assert path.stat().st_size > 5_000_000
    assert len(corpus_units(str(path), "body")) >= 2  # ranges the ranks share out
    run_dir = tmp_path / "run"
    assert run_inprocess(run_dir, data_path=str(path), text_field="body", **TINY) == 0
    start = started(run_dir)
    assert start["dataset_documents"] == 20_000
    # Every document and its end-of-sequence token: more tokens than the old 2 MB cap held.
    assert start["dataset_tokens"] > 20_000 * 42


def test_parquet_and_arrow_are_read_whole(tmp_path):
    texts = docs(3000)
    table = pa.table({"text": texts, "n": list(range(3000))})
    pq.write_table(table, tmp_path / "data.parquet", row_group_size=700)
    assert len(corpus_units(str(tmp_path / "data.parquet"))) == 5
    run_dir = tmp_path / "run"
    assert run_inprocess(run_dir, data_path=str(tmp_path / "data.parquet"), **TINY) == 0
    assert started(run_dir)["dataset_documents"] == 3000

    arrow = tmp_path / "arrow" / "data-00000.arrow"
    arrow.parent.mkdir()
    with pa.ipc.new_stream(arrow, table.schema) as writer:  # datasets' save_to_disk format
        writer.write_table(table)
    assert list(corpus_documents(str(arrow.parent))) == texts


def test_a_directory_of_jsonl_shards_is_read_as_jsonl(tmp_path):
    texts = docs(500)
    for k in range(3):
        rows = [json.dumps({"text": t}) for t in texts[k::3]]
        (tmp_path / f"part-{k}.jsonl").write_text("\n".join(rows) + "\n")
    got = list(corpus_documents(str(tmp_path)))
    assert sorted(got) == sorted(texts) and not any(g.startswith("{") for g in got)


def test_a_cap_is_asked_for_and_reported(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs(2000)))
    run_dir = tmp_path / "run"
    assert run_inprocess(run_dir, data_path=str(path), **{**TINY, "corpus_bytes": 5000}) == 0
    assert 0 < started(run_dir)["dataset_documents"] < 2000


def test_tokenize_command_writes_a_shard_set_the_run_reads_whole(tmp_path, capsys):
    texts = docs(4000)
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "shards"
    assert (
        shards_mod.main(
            ["tokenize", str(path), str(out), "--vocab", "300", "--shard-tokens", "20000"]
        )
        == 0
    )
    manifest = json.loads((out / "shards.json").read_text())
    assert manifest["documents"] == 4000 and len(manifest["shards"]) > 1
    assert "4000 documents" in capsys.readouterr().out
    run_dir = tmp_path / "run"
    assert run_inprocess(run_dir, data_path=str(out), **TINY) == 0
    start = started(run_dir)
    assert start["dataset_documents"] == 4000
    assert start["dataset_tokens"] == manifest["tokens"]
    assert (run_dir / "tokenizer.json").read_text() == (out / "tokenizer.json").read_text()
    assert not (run_dir / "data").exists()  # read as it is, not tokenized again


def test_npy_shards_from_elsewhere_count_their_documents(tmp_path, tok):
    out = tmp_path / "npy"
    out.mkdir()
    tok.save(out / "tokenizer.json")
    texts = docs(300)
    for k in range(3):
        ids = [t for d in texts[k::3] for t in (*tok.encode(d), tok.eos_id)]
        np.save(out / f"shard-{k}.npy", np.asarray(ids, dtype=np.uint16))
    run_dir = tmp_path / "run"
    assert run_inprocess(run_dir, data_path=str(out), **TINY) == 0
    assert started(run_dir)["dataset_documents"] == 300


def test_ranks_tokenize_their_own_parts_and_agree(tmp_path, tok, monkeypatch):
    """Two ranks (threads here: the build is files, not collectives) share the parts out,
    wait for each other on the files, and read what one rank alone would have."""
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs(600)))
    units = corpus_units(str(path), "text", 2000)
    assert len(units) > 4
    written: dict[str, list[int]] = {}
    real = shards_mod._write_part

    def spy(cache, index, *args, **kwargs):
        written.setdefault(threading.current_thread().name, []).append(index)
        return real(cache, index, *args, **kwargs)

    monkeypatch.setattr(shards_mod, "_write_part", spy)
    monkeypatch.setattr(shards_mod, "corpus_units", lambda p, f: corpus_units(p, f, 2000))
    results: dict[int, object] = {}

    def rank(r: int):
        results[r] = cache_build(tmp_path / "two", r, 2, tok, str(path), "text", None)

    threads = [threading.Thread(target=rank, args=(r,), name=str(r)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert written == {"0": list(range(0, len(units), 2)), "1": list(range(1, len(units), 2))}
    one = cache_build(tmp_path / "one", 0, 1, tok, str(path), "text", None)
    for r in (0, 1):
        assert results[r].documents == one.documents == 600
        assert np.array_equal(results[r].window(0, len(one)), one.window(0, len(one)))
    # Windows spanning parts read the same tokens as the flat array.
    flat = one.window(0, len(one))
    assert np.array_equal(one.window(7, 97), flat[7 * 97 : 8 * 97])


def test_shards_write_and_open_round_trip(tmp_path, tok):
    texts = docs(50)
    manifest = shards_write(iter(texts), tok, tmp_path, shard_tokens=100)
    opened = shards_open(str(tmp_path))
    assert opened.documents == 50 and len(opened) == manifest["tokens"]
    assert opened.count(tok.eos_id) == 50
    args = tokenize_argparser(__import__("argparse").ArgumentParser()).parse_args(["a", "b"])
    assert (args.field, args.vocab) == ("text", 16384)


def test_a_gpu_launch_without_cuda_fails_fast(tmp_path, capsys):
    """require_cuda (set by a launch on real GPUs): no CUDA is exit 2, never CPU training."""
    assert run_inprocess(tmp_path / "run", require_cuda=True, **TINY) == 2
    assert "finds no CUDA device" in capsys.readouterr().out
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
