"""mtc.cpu: a process and the session it leads get the CPU priority asked for."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from mtc import cpu


def session_leader() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "30"], start_new_session=True)


def group_line(pid: int) -> str | None:
    path = Path(f"/proc/{pid}/autogroup")
    return path.read_text().strip() if path.exists() else None


@pytest.mark.parametrize("nice", [7, -3])
def test_a_process_and_its_session_get_the_priority(nice):
    if nice < 0 and os.geteuid() != 0:
        pytest.skip("raising a priority needs root")
    proc = session_leader()
    try:
        assert cpu.priority_set(proc.pid, nice) is True
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == nice
        line = group_line(proc.pid)
        assert line is None or line.endswith(f"nice {nice}")
    finally:
        proc.kill()
        proc.wait()


def test_a_process_that_ended_is_left_alone():
    proc = session_leader()
    proc.kill()
    proc.wait()
    assert cpu.priority_set(proc.pid, 5) is False
