"""The agent's speed check on a busy host and on a stopped one: other processes taking
the cores must not make a node read slow (that rebooted healthy nodes of the local
provider under API load), while a node stopped on a duty cycle (the local `slow` fault)
must. The agent runs as a subprocess (``--once --checks speed``), as on a node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from health.policy import SLOW_FRACTION

AGENT = Path(__file__).resolve().parents[1] / "node" / "agent" / "mtc_agent.py"
HOG = "while True: pass"


def speed(tmp_path: Path, *, while_running=None) -> dict:
    config = tmp_path / "agent.json"
    config.write_text(json.dumps({"speed_seconds": 0.6, "speed_size": 48}))
    proc = subprocess.Popen(
        [sys.executable, "-S", str(AGENT), "--node", "n1", "--config", str(config)]
        + ["--once", "--checks", "speed"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    worker = threading.Thread(target=while_running, args=(proc,)) if while_running else None
    if worker:
        worker.start()
    out, err = proc.communicate(timeout=60)
    if worker:
        worker.join()
    assert proc.returncode == 0, err
    (check,) = json.loads(out.splitlines()[-1])["checks"]
    return check["details"]


def duty_cycle(proc: subprocess.Popen, stopped_share: float = 0.8, period: float = 0.1) -> None:
    """SIGSTOP and SIGCONT the agent until it ends, stopped `stopped_share` of the time."""
    while proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGSTOP)
            time.sleep(period * stopped_share)
            os.kill(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        time.sleep(period * (1 - stopped_share))


def test_a_busy_host_does_not_read_as_a_slow_node(tmp_path):
    alone = speed(tmp_path)
    # Three runnable processes a core: the agent gets about a quarter of the time it waits.
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(3 * os.cpu_count())]
    try:
        busy = speed(tmp_path)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert busy["gflops"] >= SLOW_FRACTION * alone["gflops"], (alone, busy)
    assert busy["cpu_s"] < 0.6 * busy["elapsed_s"]  # the host was busy indeed
    assert busy["stopped"] is False


def test_a_stopped_node_reads_slow(tmp_path):
    alone = speed(tmp_path)
    throttled = speed(tmp_path, while_running=duty_cycle)
    assert throttled["stopped"] is True
    assert throttled["gflops"] < SLOW_FRACTION * alone["gflops"], (alone, throttled)
