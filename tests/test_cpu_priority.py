"""mtc.cpu: a process and the session it leads get the CPU priority asked for."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from mtc import cpu


def session_leader() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "30"], start_new_session=True)


def niceness(pid: int) -> tuple[int, int | None]:
    """The process's own nice value, and its session's (autogroup) where the kernel has
    such groups (its line reads "/autogroup-N nice V")."""
    path = Path(f"/proc/{pid}/autogroup")
    group = int(path.read_text().split()[-1]) if path.exists() else None
    return os.getpriority(os.PRIO_PROCESS, pid), group


@pytest.mark.parametrize("nice", [7, -3])
def test_a_process_and_its_session_get_the_priority(nice):
    if nice < 0 and os.geteuid() != 0:
        pytest.skip("raising a priority needs root")
    proc = session_leader()
    try:
        assert cpu.priority_set(proc.pid, nice) is True
        own, group = niceness(proc.pid)
        assert own == nice and group in (None, nice)
    finally:
        proc.kill()
        proc.wait()


def test_a_process_that_ended_is_left_alone():
    proc = session_leader()
    proc.kill()
    proc.wait()
    assert cpu.priority_set(proc.pid, 5) is False
