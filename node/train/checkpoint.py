"""Checkpoints with torch.distributed.checkpoint (DCP), saved atomically.

A save writes everything into ``checkpoints/.step-NNNNNN.partial/``: the DCP shards
and metadata (all ranks), one ``rank-RRRRR.pt`` per rank (RNG state), and from rank 0
``trainer_state.json``, ``model.json`` (the preset) and ``tokenizer.json``. After a
barrier rank 0 writes the ``COMPLETE`` marker (JSON: step, world size, every file with
its size) *last*, fsyncs, and renames the directory to ``step-NNNNNN``. A crash at any
point leaves either a ``.partial`` directory (never looked at) or a complete one.

Interval checkpoints are saved with ``dcp.async_save`` (``checkpoint_save_async``): the
state is staged to CPU memory, training goes on while a background thread writes it,
and the marker and rename follow once rank 0's save has finished (``checkpoint_finish``,
called by the loop after a later step, or before the next or final save). The save at a
stop signal and at the last step stays synchronous.

On start, ``checkpoint_find`` walks ``step-*`` directories newest first and takes the
first whose marker parses, names its own step, lists files that exist with their
recorded sizes, and whose DCP metadata reads back; every other one is skipped with a
WARNING.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import random
import re
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

log = logging.getLogger("mtc.runtime")


@contextlib.contextmanager
def _quiet():
    """DCP warns on every single-process save/load; one process is a supported case here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")
        yield


MARKER = "COMPLETE"
FORMAT = "mtc-dcp-1"
STEP_RE = re.compile(r"^step-(\d{6,})$")


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def rng_state() -> dict:
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def rng_restore(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _partial_dir(d, root: Path, step: int) -> Path:
    tmp = root / f".{step_dir_name(step)}.partial"
    if d.is_main:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # a save of this step that died earlier
        tmp.mkdir()
    d.barrier()
    return tmp


def _rank_files(d, tmp: Path, step: int, trainer_state: dict, copy_files: dict) -> None:
    """This rank's RNG state; from rank 0 the trainer state, model.json, tokenizer.json."""
    buf = _torch_bytes({"step": step, "world_size": d.world, "rng": rng_state()})
    _write_durable(tmp / f"rank-{d.rank:05d}.pt", buf)
    if d.is_main:
        state = {**trainer_state, "step": step, "world_size": d.world, "time": time.time()}
        _write_durable(tmp / "trainer_state.json", json.dumps(state, indent=1).encode())
        for name, src in copy_files.items():
            shutil.copyfile(src, tmp / name)


def _complete(tmp: Path, root: Path, step: int, world: int, keep: int | None) -> Path:
    """Rank 0, once every rank's files are written: the marker last, then the rename."""
    final = root / step_dir_name(step)
    # .metadata, __<rank>_0.distcp, rank-*.pt, the json files, tokenizer.json
    files = {f.name: f.stat().st_size for f in sorted(tmp.iterdir()) if f.is_file()}
    marker = {"format": FORMAT, "step": step, "world_size": world, "time": time.time()}
    marker["files"] = files
    _write_durable(tmp / MARKER, json.dumps(marker, indent=1).encode())
    _fsync_dir(tmp)
    if final.exists():  # an older save of the same step (e.g. re-run after a crash)
        trash = root / f".{final.name}.old{os.getpid()}"
        os.rename(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.rename(tmp, final)
    _fsync_dir(root)
    if keep:
        _prune(root, keep, step)
    return final


def checkpoint_save(
    *,
    d,
    root: Path,
    step: int,
    model,
    optimizer,
    trainer_state: dict,
    copy_files: dict[str, Path],
    keep: int | None = None,
) -> Path:
    """Save step ``step`` under ``root`` atomically; every rank calls this."""
    tmp = _partial_dir(d, root, step)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    with _quiet():
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    _rank_files(d, tmp, step, trainer_state, copy_files)
    d.barrier()  # every rank's files are written
    final = root / step_dir_name(step)
    if d.is_main:
        _complete(tmp, root, step, d.world, keep)
    d.barrier()
    return final


@dataclass
class PendingSave:
    """An interval checkpoint being written in the background (``checkpoint_save_async``)."""

    step: int
    tmp: Path
    root: Path
    keep: int | None
    future: object
    started: float
    blocked: float  # seconds the training loop waited for it to start

    def done(self) -> bool:
        return self.future.done()


def checkpoint_save_async(
    *,
    d,
    root: Path,
    step: int,
    model,
    optimizer,
    trainer_state: dict,
    copy_files: dict[str, Path],
    keep: int | None = None,
) -> PendingSave:
    """Start saving step ``step``; training goes on while DCP writes a copy of the state
    (staged in CPU memory) from a background thread. Every rank calls this; finish with
    ``checkpoint_finish``. The small per-rank files are written first, so once rank 0's
    save is done (DCP's last phase gathers every rank's write results to rank 0) every
    file of the checkpoint is on disk."""
    t0 = time.time()
    if not d.enabled:  # the write runs in a thread, outside _quiet's reach
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")
    tmp = _partial_dir(d, root, step)
    _rank_files(d, tmp, step, trainer_state, copy_files)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    with _quiet():
        future = dcp.async_save(
            {"model": model_sd, "optim": optim_sd},
            checkpoint_id=str(tmp),
            process_group=d.checkpoint_group,
            no_dist=not d.enabled,  # one process: no collectives (and no warning per save)
        )
    return PendingSave(step, tmp, root, keep, future, t0, time.time() - t0)


def checkpoint_finish(d, pending: PendingSave) -> Path:
    """Wait for this rank's part of ``pending``; rank 0 then marks it complete. Needs no
    collective: rank 0's save finishes only after every rank's has."""
    pending.future.result()  # raises what the background write raised
    final = pending.root / step_dir_name(pending.step)
    if d.is_main:
        _complete(pending.tmp, pending.root, pending.step, d.world, pending.keep)
    return final


def _torch_bytes(obj) -> bytes:
    bio = io.BytesIO()
    torch.save(obj, bio)
    return bio.getvalue()


def _prune(root: Path, keep: int, newest: int) -> None:
    """Delete all but the ``keep`` newest complete checkpoints up to step ``newest``
    (directories of later steps were skipped as unusable and are left to look at)."""
    done = [
        p
        for p in _step_dirs(root)
        if int(STEP_RE.fullmatch(p.name).group(1)) <= newest and (p / MARKER).exists()
    ]
    for old in done[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def _step_dirs(root: Path) -> list[Path]:
    """step-* directories, newest step first."""
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = STEP_RE.fullmatch(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found, reverse=True)]


def checkpoint_problem(path: Path) -> str | None:
    """Why ``path`` is not a usable complete checkpoint, or None when it is."""
    m = STEP_RE.fullmatch(path.name)
    marker_path = path / MARKER
    if not marker_path.exists():
        return "no COMPLETE marker (a save that did not finish)"
    try:
        marker = json.loads(marker_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return f"COMPLETE marker unreadable ({exc.__class__.__name__})"
    if not isinstance(marker, dict) or marker.get("format") != FORMAT:
        return "COMPLETE marker is not an mtc checkpoint marker"
    if m and marker.get("step") != int(m.group(1)):
        return f"COMPLETE marker names step {marker.get('step')!r}, not this directory's"
    files = marker.get("files")
    if not isinstance(files, dict) or ".metadata" not in files:
        return "COMPLETE marker lists no DCP metadata"
    for name, size in files.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != size:
            return f"{name} has {f.stat().st_size} bytes, the marker says {size}"
    try:
        dcp.FileSystemReader(str(path)).read_metadata()
    except Exception as exc:  # noqa: BLE001 - any failure to read means unusable
        return f"DCP metadata unreadable ({exc.__class__.__name__}: {exc})"
    return None


def checkpoint_find(root: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest usable checkpoint under ``root`` and the ones skipped (with why)."""
    skipped = []
    for path in _step_dirs(root):
        problem = checkpoint_problem(path)
        if problem is None:
            return path, skipped
        log.warning("skipping checkpoint %s: %s", path, problem)
        skipped.append((path, problem))
    return None, skipped


def checkpoint_resolve(path: str | Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """``init_from``: a step directory, a checkpoints directory, or a run directory."""
    p = Path(path)
    if STEP_RE.fullmatch(p.name) and p.is_dir():
        problem = checkpoint_problem(p)
        if problem:
            log.warning("skipping checkpoint %s: %s", p, problem)
            return None, [(p, problem)]
        return p, []
    if (p / "checkpoints").is_dir():
        p = p / "checkpoints"
    return checkpoint_find(p)


def checkpoint_step(path: Path) -> int:
    return int(json.loads((path / MARKER).read_text())["step"])


def checkpoint_json(path: Path, name: str) -> dict | None:
    try:
        return json.loads((path / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def checkpoint_load(*, d, path: Path, model, optimizer=None) -> dict | None:
    """Load model (and optimizer) state into the already sharded objects; returns this
    rank's saved extra state (RNG), or None when the world size changed."""
    if optimizer is not None:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
    else:
        state = {"model": get_model_state_dict(model)}
    with _quiet():
        dcp.load(state, checkpoint_id=str(path))
    if optimizer is not None:
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
    else:
        set_model_state_dict(model, state["model"])
    rank_file = path / f"rank-{d.rank:05d}.pt"
    if optimizer is None or not rank_file.exists():
        return None
    extra = torch.load(rank_file, weights_only=False)
    return extra if extra.get("world_size") == d.world else None
