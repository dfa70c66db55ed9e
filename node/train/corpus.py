"""The documents of a pretraining corpus, in the formats people have, streamed.

``data_path`` may be a text file, a JSONL file (one document per line, the text in a
chosen field), a Parquet or Arrow file (a chosen column), a directory of any mix of
those (files in sorted order), or none: the Python standard library's own sources.
A directory of pre-tokenized shards (``.bin``/``.npy``) is read by ``shards``, not here.

The corpus is cut into *units* (a file, a byte range of a large JSONL or text file
ending at a newline, a Parquet row group) found without parsing anything, so each
rank tokenizes its own units in parallel and every rank agrees on the order. Nothing
here reads a whole large file into memory.
"""

from __future__ import annotations

import json
import logging
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("mtc.runtime")

SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idlelib"}
UNIT_BYTES = 4 << 20  # a large JSONL or text file is cut into ranges of about this size
JSONL = (".jsonl", ".ndjson")
PARQUET = (".parquet", ".pq")
ARROW = (".arrow", ".feather", ".ipc")
TOKEN_FILES = (".bin", ".npy")
# Beside a shard set or an exported model; never a document.
SIDE_FILES = {"tokenizer.json", "shards.json", "config.json", "model.json"}


class CorpusError(ValueError):
    """The corpus cannot be read as asked (exit code 2, with this message)."""


@dataclass(frozen=True)
class Unit:
    kind: str  # text | jsonl | parquet | arrow
    path: str
    start: int = 0  # text, jsonl: a byte range [start, end); parquet: the row group
    end: int = 0
    last: bool = True  # text: the range that ends the file (its document ends here)


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        out.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return out


def _is_binary(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return b"\0" in fh.read(4096)
    except OSError:
        return True


def _line_ranges(path: Path, unit_bytes: int) -> list[tuple[int, int]]:
    """[start, end) byte ranges of about unit_bytes, each ending after a newline."""
    size = path.stat().st_size
    out, start = [], 0
    with open(path, "rb") as fh:
        while start < size:
            end = min(start + unit_bytes, size)
            if end < size:
                fh.seek(end)
                fh.readline()
                end = fh.tell()
            out.append((start, end))
            start = end
    return out


def _file_units(path: Path, field: str, unit_bytes: int) -> list[Unit]:
    suffix = path.suffix.lower()
    if suffix in JSONL:
        return [Unit("jsonl", str(path), s, e) for s, e in _line_ranges(path, unit_bytes)]
    if suffix in PARQUET:
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        _check_column(path, pf.schema_arrow.names, field)
        return [Unit("parquet", str(path), g) for g in range(pf.metadata.num_row_groups)]
    if suffix in ARROW:
        _check_column(path, _arrow_reader(path).schema.names, field)
        return [Unit("arrow", str(path))]
    if suffix in TOKEN_FILES or path.name in SIDE_FILES or path.name.startswith("."):
        return []
    if _is_binary(path):
        log.info("corpus: %s looks binary, skipped", path)
        return []
    ranges = _line_ranges(path, unit_bytes) or [(0, 0)]
    return [
        Unit("text", str(path), s, e, last=i == len(ranges) - 1) for i, (s, e) in enumerate(ranges)
    ]


def _check_column(path: Path, names: list[str], field: str) -> None:
    if field not in names:
        raise CorpusError(f"{path}: no column {field!r} (columns: {', '.join(names)})")


def _arrow_reader(path: Path):
    import pyarrow as pa

    source = pa.memory_map(str(path))
    try:
        return pa.ipc.open_file(source)
    except pa.ArrowInvalid:  # the streaming format (what datasets' save_to_disk writes)
        return pa.ipc.open_stream(pa.memory_map(str(path)))


def corpus_units(data_path: str | None, field: str = "text", unit_bytes: int = UNIT_BYTES):
    """Every unit of the corpus, in the order its documents are read."""
    if data_path is None:
        return [Unit("text", str(f), 0, f.stat().st_size) for f in stdlib_files()]
    p = Path(data_path)
    if not p.exists():
        raise FileNotFoundError(f"data_path {data_path} does not exist")
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    units = [u for f in files for u in _file_units(f, field, unit_bytes)]
    if not units:
        raise CorpusError(f"no documents in {data_path} (text, JSONL, Parquet or Arrow)")
    return units


def _jsonl_text(row, field: str) -> str | None:
    if not isinstance(row, dict):
        return None
    value = row.get(field)
    if isinstance(value, str):
        return value
    if field == "text" and isinstance(row.get("prompt"), str):  # a prompt/response file
        return row["prompt"] + str(row.get("response", row.get("answer", "")))
    return None


def unit_documents(unit: Unit, field: str = "text") -> Iterator[str]:
    """The unit's documents (a text range is part of its file's one document)."""
    if unit.kind in ("text", "jsonl"):
        with open(unit.path, "rb") as fh:
            fh.seek(unit.start)
            raw = fh.read(unit.end - unit.start)
        if unit.kind == "text":
            if raw:
                yield raw.decode("utf-8", errors="replace")
            return
        missing = bad = 0
        for line in raw.splitlines():
            if not line.strip():
                continue
            try:
                text = _jsonl_text(json.loads(line), field)
            except ValueError:
                bad += 1
                continue
            if text is None:
                missing += 1
            elif text:
                yield text
        if bad or missing:
            log.warning(
                "corpus: %s bytes %d-%d: %d lines not JSON, %d without a %r string, skipped",
                unit.path,
                unit.start,
                unit.end,
                bad,
                missing,
                field,
            )
        return
    if unit.kind == "parquet":
        import pyarrow.parquet as pq

        table = pq.ParquetFile(unit.path).read_row_group(unit.start, columns=[field])
        batches = table.to_batches(max_chunksize=8192)
    else:
        batches = iter(_arrow_reader(Path(unit.path)))
    for batch in batches:
        for value in batch.column(batch.schema.get_field_index(field)).to_pylist():
            if isinstance(value, str) and value:
                yield value


def corpus_documents(
    data_path: str | None, field: str = "text", max_chars: int | None = None
) -> Iterator[str]:
    """The corpus's documents in order; with ``max_chars`` only its first that many
    characters (the last document cut). A text file split into several units is
    joined back into its one document."""
    total = 0
    pending: list[str] = []
    for unit in corpus_units(data_path, field):
        for text in unit_documents(unit, field):
            if unit.kind == "text":
                pending.append(text)
                if not unit.last:
                    continue
                text, pending = "".join(pending), []
            if max_chars is not None and total + len(text) >= max_chars:
                if max_chars > total:
                    yield text[: max_chars - total]
                return
            total += len(text)
            yield text
        if unit.kind == "text" and unit.last and pending:
            yield "".join(pending)
            pending = []
