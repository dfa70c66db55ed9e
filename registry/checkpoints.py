"""Finding a run's final checkpoint without loading torch (the web process and the
registration poll only need to know where it is; the export reads it fully). The run
writes these folders as its owner: they are read through mtc.userfs (no link followed,
only the owner's own files)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from mtc import userfs

# The runtime's layout (node/train/checkpoint.py): step-NNNNNN/COMPLETE.
STEP_RE = re.compile(r"^step-([0-9]{6,})$")
MARKER = "COMPLETE"
MARKER_MAX = 64 * 1024  # a line of JSON


def _marker_step(step_dir: Path) -> int | None:
    try:
        marker = json.loads(userfs.read_bytes(step_dir / MARKER, limit=MARKER_MAX))
    except (OSError, ValueError):
        return None
    return marker.get("step") if isinstance(marker, dict) else None


def checkpoint_is_complete(step_dir: Path) -> bool:
    """A step directory whose COMPLETE marker names its own step."""
    m = STEP_RE.fullmatch(step_dir.name)
    return bool(m) and userfs.is_dir(step_dir) and _marker_step(step_dir) == int(m.group(1))


def final_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The newest complete step directory under a run's checkpoints directory."""
    root = Path(checkpoint_dir)
    try:
        names = userfs.list_dir(root)
    except OSError:
        return None
    steps = sorted(
        ((int(m.group(1)), root / name) for name in names if (m := STEP_RE.fullmatch(name))),
        reverse=True,
    )
    return next((p for _, p in steps if checkpoint_is_complete(p)), None)
