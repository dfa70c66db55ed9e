"""Install the device shim into an emulated node's directory (the local provider calls this).

    install(node_dir, gpu_count, gpu_type)

creates ``<node_dir>/bin/`` with the executable ``nvidia-smi``, ``dcgmi`` and
``mtc-gpu-check`` (plus ``_shimlib.py`` and ``mtc_agent.py``, which they import), and writes
``gpus.json``, an empty ``faults.json``, an empty ``kmsg.log`` (the node's kernel log) and
``agent.json``, a config for the agent on this node:

    python3 <node_dir>/bin/mtc_agent.py --node NAME --config <node_dir>/agent.json --once

``gpu_type`` is an accelerator type of the cluster spec (``NVIDIA_H200_141GB``) or the name
nvidia-smi prints (``NVIDIA H200``). Files are copied (``link=True``: symlinked to this
checkout instead). A copied tool's ``#!/usr/bin/env python3`` becomes this interpreter with
``-IS``: the agent runs the tools several times a round on every node, and whatever
``python3`` PATH finds first may be a wrapper (pyenv's shim is a bash script that costs
about 0.13 s of CPU a call, against 0.01 s for the interpreter itself).
Reinstalling resets the faults and the kernel log, like a reimage.
Also a CLI: ``python3 install.py NODE_DIR COUNT TYPE``. Stdlib only.
"""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import shutil
import sys

try:  # imported as node.shim.install
    from . import _shimlib
except ImportError:  # run as a script, or imported by path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _shimlib

SHIM_DIR = os.path.dirname(os.path.abspath(__file__))
AGENT_PATH = os.path.join(os.path.dirname(SHIM_DIR), "agent", "mtc_agent.py")
TOOLS = ("nvidia-smi", "dcgmi", "mtc-gpu-check")


def install(
    node_dir,
    gpu_count: int,
    gpu_type: str,
    *,
    memory_mib: int | None = None,
    link: bool = False,
    disk_paths: list[str] | None = None,
) -> str:
    """Set up the shim for one node; returns the bin directory to put first on PATH."""
    node_dir = os.path.abspath(os.fspath(node_dir))
    bin_dir = os.path.join(node_dir, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    sources = [(os.path.join(SHIM_DIR, t), t) for t in TOOLS]
    sources += [
        (os.path.join(SHIM_DIR, "_shimlib.py"), "_shimlib.py"),
        (AGENT_PATH, "mtc_agent.py"),
    ]
    for src, name in sources:
        dst = os.path.join(bin_dir, name)
        if os.path.lexists(dst):
            os.unlink(dst)
        if link:
            os.symlink(src, dst)
        elif name in TOOLS:
            _tool_copy(src, dst)
        else:
            shutil.copyfile(src, dst)
            os.chmod(dst, 0o755 if name == "mtc_agent.py" else 0o644)
    # The tools import _shimlib and never write bytecode into a node's directory: compiled
    # once here, each tool starts in the time of a bare interpreter.
    lib = os.path.join(bin_dir, "_shimlib.py")
    py_compile.compile(lib, cfile=importlib.util.cache_from_source(lib), doraise=True)

    name, default_memory, _device, _arch = _shimlib.gpu_type_info(gpu_type)
    gpus = {
        "count": int(gpu_count),
        "type": name,
        "memory_mib": int(memory_mib or default_memory),
        "emulated": True,
    }
    _shimlib.write_json_atomic(os.path.join(node_dir, "gpus.json"), gpus)
    _shimlib.write_json_atomic(os.path.join(node_dir, "faults.json"), dict(_shimlib.EMPTY_FAULTS))
    with open(os.path.join(node_dir, "kmsg.log"), "w", encoding="utf-8"):
        pass
    if disk_paths is None:
        scratch = os.path.join(node_dir, "scratch")
        disk_paths = [scratch if os.path.isdir(scratch) else node_dir]
    agent_config = {
        "expected_gpus": int(gpu_count),
        "disk_paths": list(disk_paths),
        "kernel_log": os.path.join(node_dir, "kmsg.log"),
        "path_prepend": bin_dir,
        "state_file": os.path.join(node_dir, "agent-state.json"),
        "dcgm_level": 1,
    }
    _shimlib.write_json_atomic(os.path.join(node_dir, "agent.json"), agent_config)
    state = os.path.join(node_dir, "agent-state.json")
    if os.path.exists(state):
        os.unlink(state)
    return bin_dir


def _tool_copy(src: str, dst: str) -> None:
    """Copy a tool with its interpreter named outright: the standard library only (-I -S),
    no PATH lookup, so it starts in the time of a bare interpreter."""
    with open(src, encoding="utf-8") as fh:
        first, rest = fh.readline(), fh.read()
    if not first.startswith("#!"):
        raise ValueError(f"{src} has no #! line")
    with open(dst, "w", encoding="utf-8") as fh:
        fh.write(f"#!{sys.executable} -IS\n{rest}")
    os.chmod(dst, 0o755)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        sys.stderr.write("usage: install.py NODE_DIR GPU_COUNT GPU_TYPE\n")
        return 2
    bin_dir = install(argv[0], int(argv[1]), argv[2])
    sys.stdout.write(json.dumps({"bin": bin_dir}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
