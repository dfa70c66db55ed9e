"""Finding a run's final checkpoint without loading torch (the web process and the
registration poll only need to know where it is; the export reads it fully)."""

from __future__ import annotations

import json
import re
from pathlib import Path

# The runtime's layout (node/train/checkpoint.py): step-NNNNNN/COMPLETE.
STEP_RE = re.compile(r"^step-([0-9]{6,})$")
MARKER = "COMPLETE"


def _marker_step(step_dir: Path) -> int | None:
    try:
        marker = json.loads((step_dir / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return marker.get("step") if isinstance(marker, dict) else None


def checkpoint_is_complete(step_dir: Path) -> bool:
    """A step directory whose COMPLETE marker names its own step."""
    m = STEP_RE.fullmatch(step_dir.name)
    return bool(m) and step_dir.is_dir() and _marker_step(step_dir) == int(m.group(1))


def final_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The newest complete step directory under a run's checkpoints directory."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return None
    steps = sorted(
        ((int(m.group(1)), p) for p in root.iterdir() if (m := STEP_RE.fullmatch(p.name))),
        reverse=True,
    )
    return next((p for _, p in steps if checkpoint_is_complete(p)), None)
