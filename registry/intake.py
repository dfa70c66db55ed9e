"""Taking back what an export wrote, as mtc: only files it can check without unpickling
(``*.safetensors`` with a well-formed header, the JSON files and the chat template
transformers writes), regular files owned by the export's account, copied first and
checked on mtc's own copy (the owner may change theirs meanwhile). Everything else
(pickles, ``.bin`` weights, symlinks, directories) is left out."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from node.export import EXPORT_INFO, TAKEN_BACK

from .export import ExportFailed

SAFETENSORS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}\.safetensors")
SAFETENSORS_MAX_HEADER = 100_000_000  # the format's own limit
TEXT_MAX_BYTES = 64 * 2**20  # tokenizer.json is the largest: a few MB
REQUIRED = ("config.json", "tokenizer.json")
CHUNK = 2**20
MAX_ENTRIES = 1000  # save_pretrained writes about ten


@dataclass
class Taken:
    """What was copied into the export directory, and what was not."""

    bytes: int = 0
    files: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    info: dict = field(default_factory=dict)  # mtc_export.json as written

    def message(self) -> str:
        """The version's status line, from the export's own summary (the owner's
        process wrote it: plain values only)."""

        def plain(key: str, kind: type, default):
            value = self.info.get(key)
            if isinstance(value, str):  # PostgreSQL stores no NUL in text
                value = value.replace("\x00", "")
            return value if isinstance(value, kind) and not isinstance(value, bool) else default

        text = (
            f"Exported {str(plain('architecture', str, 'a model'))[:80]} "
            f"({plain('parameters', int, 0):,} parameters, {str(plain('dtype', str, '?'))[:16]}, "
            f"{self.bytes / 1e6:.1f} MB) from step {plain('step', int, '?')}."
        )
        if self.left_out:
            text += f" Left out (not checkable): {', '.join(self.left_out)[:200]}."
        return text


def wanted(name: str) -> bool:
    return name in TAKEN_BACK or bool(SAFETENSORS_RE.fullmatch(name))


def _open_entry(dir_fd: int, name: str, uid: int) -> tuple[int, os.stat_result]:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:
        raise ExportFailed(f"{name} cannot be opened ({exc.strerror}; a symlink?)") from exc
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = f"{name} is not a regular file"
    elif info.st_uid != uid:
        problem = f"{name} belongs to uid {info.st_uid}, not the export's account ({uid})"
    if problem:
        os.close(fd)
        raise ExportFailed(problem)
    return fd, info


def _copy(src_fd: int, dest: Path, limit: int) -> int:
    """Copy at most ``limit`` bytes (the file may grow while it is read)."""
    copied = 0
    out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        while chunk := os.read(src_fd, CHUNK):
            copied += len(chunk)
            if copied > limit:
                raise ExportFailed(f"{dest.name} is larger than the export may be")
            os.write(out, chunk)
    finally:
        os.close(out)
    return copied


def safetensors_problem(path: Path) -> str | None:
    """Why ``path`` is not a well-formed safetensors file: an 8-byte little-endian header
    length, a JSON header naming each tensor's dtype, shape and byte range, the data."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        length = int.from_bytes(fh.read(8), "little")
        if size < 8 or not 2 <= length <= min(SAFETENSORS_MAX_HEADER, size - 8):
            return "its header length is not a safetensors header's"
        try:
            header = json.loads(fh.read(length).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return "its header is not JSON"
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    data_size, end = size - 8 - length, 0
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                return "its __metadata__ is not a map of strings"
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str):
            return f"tensor {name[:80]!r} has no dtype"
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            return f"tensor {name[:80]!r} has no valid shape"
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_size
        ):
            return f"tensor {name[:80]!r} has byte offsets outside the file"
        end = max(end, offsets[1])
    if end != data_size:
        return "its data does not match its header"
    return None


def _text_problem(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json" and not isinstance(json.loads(text), dict):
            return "it is not a JSON object"
    except (UnicodeDecodeError, ValueError):
        return "it is not UTF-8 JSON" if path.suffix == ".json" else "it is not UTF-8 text"
    return None


def _check(path: Path) -> None:
    if path.name.endswith(".safetensors"):
        problem = safetensors_problem(path)
    else:
        problem = _text_problem(path)
    if problem:
        raise ExportFailed(f"{path.name}: {problem}")


def take_back(
    *, staging_fd: int, name: str, uid: int, out_dir: Path, max_bytes: int, info: dict
) -> Taken:
    """Copy the checkable files of ``staging_fd``/``name`` (written by ``uid``) into
    ``out_dir`` (atomically: a partial directory renamed at the end, replacing an
    earlier attempt). ``mtc_export.json`` is rewritten with mtc's own ``info`` on top.
    Raises ExportFailed."""
    try:
        src = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=staging_fd)
    except OSError as exc:
        raise ExportFailed(f"it wrote no directory ({exc.strerror})") from exc
    tmp = out_dir.with_name(f".{out_dir.name}.partial-{os.getpid()}")
    taken = Taken()
    try:
        if os.fstat(src).st_uid != uid:
            raise ExportFailed("its directory is not the export account's")
        # registry/ and registry/<model>/ are passable, never listable: a replica's
        # account reads its version by path and cannot list what else is registered.
        for folder in (out_dir.parent.parent, out_dir.parent):
            folder.mkdir(mode=0o711, parents=True, exist_ok=True)
            os.chmod(folder, 0o711)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for entry in _names(src):
            if not wanted(entry):
                taken.left_out.append(entry)
                continue
            fd, _ = _open_entry(src, entry, uid)
            try:
                limit = TEXT_MAX_BYTES if entry in TAKEN_BACK else max_bytes - taken.bytes
                taken.bytes += _copy(fd, tmp / entry, limit)
            finally:
                os.close(fd)
            _check(tmp / entry)
            taken.files.append(entry)
        _complete(tmp, taken, info)
        if out_dir.exists():  # an earlier attempt of the same version
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(src)
    return taken


def _names(dir_fd: int) -> list[str]:
    names = []
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            names.append(entry.name)
            if len(names) > MAX_ENTRIES:
                raise ExportFailed(f"it wrote more than {MAX_ENTRIES} files")
    return sorted(names)


def _complete(tmp: Path, taken: Taken, info: dict) -> None:
    missing = [n for n in REQUIRED if n not in taken.files]
    if not any(n.endswith(".safetensors") for n in taken.files):
        missing.insert(0, "*.safetensors")
    if missing:
        raise ExportFailed(f"it wrote no {', '.join(missing)}")
    written = tmp / EXPORT_INFO
    taken.info = json.loads(written.read_text(encoding="utf-8")) if written.exists() else {}
    summary = {**taken.info, **info, "bytes": taken.bytes}
    if taken.left_out:
        summary["left_out"] = taken.left_out
    written.unlink(missing_ok=True)
    written.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    if EXPORT_INFO not in taken.files:
        taken.files.append(EXPORT_INFO)
