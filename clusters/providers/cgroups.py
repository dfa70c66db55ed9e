"""Whether local clusters' jobs can be contained by Slurm's cgroup plugins on this host
(proctrack/cgroup, task/cgroup over cgroup v1: cpuset, memory, devices, freezer), and
the host's memory every local node declares. Containers and laptops often give nested
daemons no writable cgroup v1 hierarchy: then local clusters run without cgroups
(proctrack/linuxproc, task/none) and `make run` says so."""

from __future__ import annotations

import os
import secrets
from functools import lru_cache
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("cpuset", "memory", "devices", "freezer")
MEMORY_RESERVE_MB = 1024  # left to mtc and the daemons out of what each node declares


@lru_cache(maxsize=1)
def cgroups_problem() -> str | None:
    """Why local clusters run without cgroups here, or None when they can have them."""
    if os.environ.get("MTC_LOCAL_CGROUPS", "1") == "0":
        return "MTC_LOCAL_CGROUPS=0"
    if os.geteuid() != 0:
        return "mtc is not root"
    mounts = Path("/proc/mounts").read_text().splitlines()
    v1 = {
        opt
        for line in mounts
        if line.split()[2:3] == ["cgroup"]
        for opt in line.split()[3].split(",")
    }
    missing = [c for c in CONTROLLERS if c not in v1]
    if missing:
        return f"no cgroup v1 hierarchy for {', '.join(missing)}"
    for controller in CONTROLLERS:
        probe = CGROUP_ROOT / controller / f"mtc-probe-{secrets.token_hex(4)}"
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError as exc:
            return f"{CGROUP_ROOT / controller} cannot be written ({exc.strerror})"
    return None


def host_memory_mb() -> int:
    """What each local node declares as RealMemory: the host's, less a reserve."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) // 1024
            return max(256, total - MEMORY_RESERVE_MB)
    return 1024


def node_cgroups_remove(node_name: str) -> None:
    """The cgroups slurmd made for a node (``slurm_<node>`` in each hierarchy, with its
    emptied job and step groups), once the node is gone: they would pile up on the host."""
    for controller in CONTROLLERS:
        top = CGROUP_ROOT / controller / f"slurm_{node_name}"
        if not top.is_dir() or top.is_symlink():
            continue
        for dirpath, _dirs, _files in os.walk(top, topdown=False):
            try:
                os.rmdir(dirpath)  # a cgroup with no task and no child: its files go with it
            except OSError:
                pass
