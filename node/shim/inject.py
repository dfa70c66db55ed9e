"""Inject and clear device faults on an emulated node (the device shim reads faults.json).

    inject(node_dir, "ecc", gpu=3)                 # count=1, remap="pending"|"failure"|"none"
    inject(node_dir, "xid", code=79, gpu=2)        # also appends the NVRM line to kmsg.log
    inject(node_dir, "dcgm")  /  inject(node_dir, "dcgm", gpu=4)
    inject(node_dir, "sdc")   /  inject(node_dir, "sdc", gpu=1)
    inject(node_dir, "gpu-missing", gpu=5)
    clear(node_dir, "ecc")  /  clear(node_dir)     # one kind / every fault

GPU numbers are physical slots (0..count-1). The shim cannot write the kernel log, so an XID
is appended to ``<node_dir>/kmsg.log``, the emulated node's kernel log (the agent's
``kernel_log``); clearing a fault leaves the log alone, as a real kernel log keeps old lines.
Also a CLI: ``python3 inject.py NODE_DIR KIND [key=value ...]`` / ``... NODE_DIR clear [KIND]``.
Stdlib only.
"""

from __future__ import annotations

import json
import os
import sys
import time

try:  # imported as node.shim.inject
    from . import _shimlib
except ImportError:  # run as a script, or imported by path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _shimlib

KINDS = ("ecc", "xid", "dcgm", "sdc", "gpu-missing")
_ALIASES = {"gpu_missing": "gpu-missing", "missing": "gpu-missing"}


def _kind(kind: str) -> str:
    kind = _ALIASES.get(kind, kind)
    if kind not in KINDS:
        raise ValueError(f"unknown fault kind {kind!r} (known: {', '.join(KINDS)})")
    return kind


def _gpu_slot(node_dir: str, params: dict, default: int = 0) -> int:
    spec = _shimlib.read_json(os.path.join(node_dir, "gpus.json"), {})
    count = int(spec.get("count", 0) or 0) if isinstance(spec, dict) else 0
    gpu = int(params.get("gpu", default))
    if count and not 0 <= gpu < count:
        raise ValueError(f"gpu {gpu} is out of range: the node has {count} GPUs")
    return gpu


def xid_line(code: int, slot: int, text: str | None = None, when: float | None = None) -> str:
    """A kernel log line as ``dmesg --ctime`` prints it."""
    stamp = time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(when))
    body = text or _shimlib.XID_TEXT.get(code, "pid='<unknown>', name=<unknown>, Xid event.")
    return f"[{stamp}] NVRM: Xid (PCI:{_shimlib.xid_pci(slot)}): {code}, {body}"


def inject(node_dir, kind: str, **params) -> dict:
    """Set a fault in ``<node_dir>/faults.json``; returns the new faults."""
    node_dir = os.fspath(node_dir)
    kind = _kind(kind)
    faults = _shimlib.load_faults(node_dir)
    if kind == "ecc":
        remap = params.get("remap", "pending")
        if remap not in ("pending", "failure", "none"):
            raise ValueError("remap must be 'pending', 'failure' or 'none'")
        faults["ecc"] = {
            "gpu": _gpu_slot(node_dir, params),
            "count": int(params.get("count", 1)),
            "remap": remap,
        }
    elif kind == "xid":
        code = int(params.get("code", 79))
        slot = _gpu_slot(node_dir, params)
        faults["xid"] = {"code": code, "gpu": slot}
        line = xid_line(code, slot, params.get("message"))
        with open(os.path.join(node_dir, "kmsg.log"), "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
    elif kind in ("dcgm", "sdc"):
        faults[kind] = {"gpu": _gpu_slot(node_dir, params)} if "gpu" in params else True
    else:  # gpu-missing
        faults["gpu-missing"] = {"gpu": _gpu_slot(node_dir, params)}
    _shimlib.write_json_atomic(os.path.join(node_dir, "faults.json"), faults)
    return faults


def clear(node_dir, kind: str | None = None) -> dict:
    """Clear one fault kind, or every fault when kind is None; returns the new faults."""
    node_dir = os.fspath(node_dir)
    if kind is None:
        faults = dict(_shimlib.EMPTY_FAULTS)
    else:
        kind = _kind(kind)
        faults = _shimlib.load_faults(node_dir)
        faults[kind] = _shimlib.EMPTY_FAULTS[kind]
    _shimlib.write_json_atomic(os.path.join(node_dir, "faults.json"), faults)
    return faults


def faults(node_dir) -> dict:
    """The node's current faults."""
    return _shimlib.load_faults(os.fspath(node_dir))


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.stderr.write(
            "usage: inject.py NODE_DIR KIND [key=value ...] | inject.py NODE_DIR clear [KIND]\n"
        )
        return 2
    node_dir, kind = argv[0], argv[1]
    try:
        if kind == "clear":
            result = clear(node_dir, argv[2] if len(argv) > 2 else None)
        else:
            params = dict(a.split("=", 1) for a in argv[2:] if "=" in a)
            result = inject(node_dir, kind, **params)
    except ValueError as exc:
        sys.stderr.write(f"inject.py: {exc}\n")
        return 2
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
