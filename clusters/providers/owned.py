"""The processes a local cluster (or one of its nodes) owns: what stopping it may end.

Only two kinds, never a process that merely mentions the cluster's directory (a
user's `mtc login` shell has SLURM_CONF set, a `tail -f` names a job's output):

- its daemons, by pid file, each checked against its command line (pid reuse), and
- its jobs' processes: every slurmstepd that holds a step socket in one of the
  cluster's node spool directories (Slurm's own record of the steps a node runs),
  with all of its descendants (the tasks; proctrack/linuxproc tracks the same tree).
"""

from __future__ import annotations

import os
from pathlib import Path

from . import procs


def _cmdline(pid: int) -> bytes:
    return procs._read(f"/proc/{pid}/cmdline")


def _checked(pidfile: Path, *markers: str) -> int | None:
    """The pid in ``pidfile`` if it runs and its command line holds every marker."""
    pid = procs.pid_from_file(pidfile)
    if not pid or not procs.is_running(pid):
        return None
    cmdline = _cmdline(pid)
    return pid if all(m.encode() in cmdline for m in markers) else None


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = procs._read(f"/proc/{entry}/stat")
        try:
            ppid = int(stat.rsplit(b")", 1)[1].split()[1])
        except (IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    return children


def _with_descendants(pids: set[int], children: dict[int, list[int]]) -> set[int]:
    out, todo = set(), list(pids)
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.add(pid)
        todo.extend(children.get(pid, ()))
    return out


def _step_socket_inodes(spool_dirs: list[Path]) -> set[str]:
    """Inodes of the unix sockets slurmstepd listens on in these spool directories."""
    prefixes = tuple(str(d) + "/" for d in spool_dirs)
    inodes = set()
    for line in procs._read("/proc/net/unix").decode(errors="replace").splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7].startswith(prefixes):
            inodes.add(fields[6])
    return inodes


def slurmstepds(spool_dirs: list[Path]) -> set[int]:
    """The slurmstepd processes serving steps out of these node spool directories."""
    inodes = _step_socket_inodes(spool_dirs)
    if not inodes:
        return set()
    wanted = {f"socket:[{inode}]" for inode in inodes}
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or procs._read(f"/proc/{entry}/comm").strip() != b"slurmstepd":
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") in wanted:
                    found.add(int(entry))
                    break
            except OSError:
                continue
    return found


def _spool(root: Path, node: str) -> Path:
    return root / "nodes" / node / "spool"  # SlurmdSpoolDir (slurm/config.py)


def node_owned(root: Path, node: str) -> set[int]:
    """What a power loss of ``node`` ends: its slurmd, agent, throttle, and job steps."""
    run, conf = root / "run", str(root / "etc" / "slurm.conf")
    daemons = {
        _checked(run / f"slurmd-{node}.pid", "slurmd", conf),
        _checked(run / f"throttle-{node}.pid", "throttle.py", str(run / f"slurmd-{node}.pid")),
    }
    children = _children_map()
    agent = _checked(run / f"agent-{node}.pid", str(root / "nodes" / node / "agent.json"))
    owned = {pid for pid in daemons if pid}
    if agent:  # the agent's checks run in their own sessions; they go with it
        owned |= _with_descendants({agent}, children)
    owned |= _with_descendants(slurmstepds([_spool(root, node)]), children)
    owned.discard(os.getpid())
    return owned


def cluster_owned(root: Path) -> set[int]:
    """Every daemon the cluster runs (controller, munged, slurmrestd, each node's) and
    every process of its jobs."""
    run, conf = root / "run", str(root / "etc" / "slurm.conf")
    owned = {
        _checked(run / "slurmctld.pid", "slurmctld", conf),
        _checked(run / "munged.pid", "munged", str(run / "munge.sock")),
        _checked(run / "slurmrestd.pid", "slurmrestd", conf),
    }
    pids = {pid for pid in owned if pid}
    nodes = root / "nodes"
    names = sorted(p.name for p in nodes.iterdir() if p.is_dir()) if nodes.is_dir() else []
    # Pid files of nodes whose directory is already gone still count.
    if run.is_dir():
        names += [
            f.name.removeprefix("slurmd-").removesuffix(".pid") for f in run.glob("slurmd-*.pid")
        ]
    for name in sorted(set(names)):
        pids |= node_owned(root, name)
        # The `fabric` fault's throttle outlives a node's reboot (a bad link stays bad),
        # so node_owned leaves it; it ends with the cluster.
        slurmd_pidfile = str(run / f"slurmd-{name}.pid")
        pids.add(_checked(run / f"throttle-fabric-{name}.pid", "throttle.py", slurmd_pidfile))
    pids |= orphaned_job_processes(conf)
    pids.discard(None)
    return pids


def orphaned_job_processes(conf: str) -> set[int]:
    """Job processes of the cluster no slurmstepd leads to any more (a batch script's
    srun whose step went first): their environment names a job of this cluster (its
    SLURM_CONF and a SLURM_JOB_ID). A shell that only has the SLURM_CONF is left be."""
    return {
        pid
        for pid in procs.processes_mentioning(f"SLURM_CONF={conf}\0")
        if b"\0SLURM_JOB_ID=" in b"\0" + procs._read(f"/proc/{pid}/environ")
    }
