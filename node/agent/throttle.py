"""Throttle one emulated node's CPU for the `slow` fault: stop and continue its
processes (its slurmd, its job tasks and its agent) on a duty cycle. With --jobs-only
(the `straggle` fault) only its job processes: those Slurm started for a job on the node
(their environment names the job and the node), so the agent's own checks run at full
speed and only the job's step times can tell. Stdlib only.

    python3 throttle.py --node NAME --pidfile SLURMD_PID_FILE [--duty 0.7] [--jobs-only]
        [--only-comm NAME]

With --jobs-only (the `straggle` fault) only the node's job processes are throttled; with
--only-comm (the `fabric` fault) only the node's processes named NAME (/proc/PID/comm),
the slurmd pid file's process excluded.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

PERIOD_S = 0.2


def node_pids(node: str, pidfile: str, *, jobs_only: bool = False, only_comm: str = "") -> set[int]:
    """The node's slurmd and every process that says it runs on the node (of this
    cluster: its SLURM_CONF, next to the pid file's run/ directory, must match too);
    ``jobs_only``: only the processes of jobs on the node (SLURM_JOB_ID set, the node
    their SLURMD_NODENAME: job tasks and the batch script, not slurmd, slurmstepd, the
    agent or the health check); ``only_comm``: only the processes of that name."""
    pids: set[int] = set()
    if not jobs_only and not only_comm:
        try:
            with open(pidfile) as fh:
                pids.add(int(fh.read().strip()))
        except (OSError, ValueError):
            pass
    needles = (f"SLURMD_NODENAME={node}\0".encode(),)
    if not jobs_only:
        needles += (f"MTC_NODE={node}\0".encode(),)
    conf = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(pidfile))), "etc", "slurm.conf"
    )
    same_cluster = f"SLURM_CONF={conf}\0".encode()
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        # The name first: one short read rules out nearly every process on a busy host.
        if only_comm and _comm(entry) != only_comm:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read() + b"\0"
        except OSError:
            continue
        if jobs_only and b"SLURM_JOB_ID=" not in environ:
            continue
        if same_cluster in environ and any(needle in environ for needle in needles):
            pids.add(int(entry))
    return pids


def _comm(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _signal(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--node", required=True)
    parser.add_argument("--pidfile", required=True)
    parser.add_argument("--duty", type=float, default=0.7, help="share of time stopped")
    parser.add_argument("--jobs-only", action="store_true", help="only the node's job processes")
    parser.add_argument("--only-comm", default="", help="only processes of this name")
    args = parser.parse_args()
    running = True

    def stop(signum, frame):
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    _run_on_time()
    pids: set[int] = set()
    scanned = 0.0
    try:
        while running:
            cycle = time.monotonic()
            _signal(pids, signal.SIGSTOP)
            # Look for new processes (a check's ranks) while the known ones are stopped:
            # a scan on a busy host takes tens of ms, which must not lengthen the run window.
            if cycle - scanned >= PERIOD_S:
                found = node_pids(
                    args.node, args.pidfile, jobs_only=args.jobs_only, only_comm=args.only_comm
                )
                _signal(found - pids, signal.SIGSTOP)
                _signal(pids - found, signal.SIGCONT)
                pids, scanned = found, cycle
            _sleep_until(cycle + PERIOD_S * args.duty)
            _signal(pids, signal.SIGCONT)
            _sleep_until(cycle + PERIOD_S)
    finally:
        _signal(pids, signal.SIGCONT)


def _run_on_time() -> None:
    """Wake on time however busy the host: a late wake-up after a continue lets the
    throttled processes run on, long enough for a whole measuring round on 2 cores.
    A real-time class where allowed (root), else the highest nice value we may take."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (AttributeError, OSError):
        try:
            os.nice(-10)
        except OSError:
            pass


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


if __name__ == "__main__":
    main()
