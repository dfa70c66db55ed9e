"""CPU priority between mtc's own processes on one machine.

Linux shares the CPU between sessions before it shares it between processes (autogroup):
each daemon that detached into its own session weighs as much as the whole web server.
On a machine that also runs a local cluster, the emulated nodes (their slurmd, jobs and
health agents stand for other machines) once took the cores from the web server in
bursts: every 10 s, when the node agents ran their checks together, API answers stalled
for a second. So the nodes yield (MTC_LOCAL_NODE_NICE) and the web server, which people
and their scripts wait on, comes first (MTC_WEB_NICE).
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def priority_set(pid: int, nice: int) -> bool:
    """Give a process, and the session it belongs to, the CPU priority ``nice`` (-20..19).

    The session's group is what counts where the kernel groups by session; the process's
    own value (inherited by what it starts) counts where it does not. A value below 0
    needs root (CAP_SYS_NICE). Best effort: False when neither could be set."""
    done = False
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
        done = True
    except OSError as exc:
        log.info("process %s keeps its CPU priority (%s)", pid, exc)
    try:
        with open(f"/proc/{pid}/autogroup", "w") as fh:
            fh.write(str(nice))
        done = True
    except OSError:
        pass  # no autogroup in this kernel, or not allowed: the process's own value holds
    return done
