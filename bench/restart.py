"""A stopped stack comes back by itself: `make run` (scripts/run.py) with the demo
cluster, then its daemons all stopped as a host restart would (`make stop-clusters`),
then `make run` again. Prints the seconds from the second start to the demo cluster
RUNNING with every node idle in Slurm, and the repairs requested meanwhile (0).

    .venv/bin/python bench/restart.py [--rounds 2]

A private data dir, Redis port and web port; the Unix accounts it makes (local
identity) and every daemon are removed at the end."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mtc.devstack import free_port, unix_accounts_remove  # noqa: E402

PY = sys.executable


def env_for(data: Path) -> dict[str, str]:
    return {
        **os.environ,
        "MTC_DATA_DIR": str(data),
        "MTC_PORT": str(free_port()),
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "MTC_ADMIN_PASSWORD": "bench-restart-pw",
        "MTC_UID_RANGE": "29800-29899",
    }


def start(env: dict[str, str], log: Path) -> subprocess.Popen:
    out = open(log, "ab")  # noqa: SIM115 - the child holds it
    return subprocess.Popen(
        [PY, "scripts/run.py"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
    )


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)


def demo_idle(data: Path) -> bool:
    conf = data / "clusters" / "demo" / "etc" / "slurm.conf"
    if not conf.exists():
        return False
    proc = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%T"],
        env={**os.environ, "SLURM_CONF": str(conf)},
        capture_output=True,
        text=True,
        timeout=10,
    )
    states = proc.stdout.split()
    return proc.returncode == 0 and len(states) == 4 and set(states) == {"idle"}


def db(data: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(data / "mtc.sqlite3", timeout=10) as conn:
        return conn.execute(sql).fetchall()


def demo_running(data: Path) -> bool:
    rows = db(data, "select state from clusters_cluster where cluster_id = 'demo'")
    return bool(rows) and rows[0][0] == "RUNNING"


def wait(predicate, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if predicate():
                return time.monotonic() - started
        except (sqlite3.Error, subprocess.TimeoutExpired):
            pass
        time.sleep(0.25)
    raise SystemExit(f"not back within {timeout:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="mtc-bench-restart-"))
    data.chmod(0o711)
    env = env_for(data)
    log = Path(tempfile.mkdtemp(prefix="mtc-bench-restart-log-")) / "run.log"
    figures = []
    try:
        proc = start(env, log)
        wait(lambda: demo_idle(data) and demo_running(data), 180)
        for _ in range(args.rounds):
            stop(proc)
            subprocess.run(
                [PY, "manage.py", "mtc", "daemons", "stop"],
                cwd=ROOT,
                env=env,
                check=True,
                capture_output=True,
            )
            assert not demo_idle(data)
            started = time.monotonic()
            proc = start(env, log)
            wait(lambda: demo_idle(data) and demo_running(data), 90)
            back = time.monotonic() - started
            time.sleep(5)  # a few poll rounds after: would anything ask for a repair?
            repairs = db(data, "select count(*) from clusters_operation where kind = 'REPAIR_NODE'")
            figures.append({"back_s": round(back, 1), "repairs": repairs[0][0]})
            print(
                f"restart: demo RUNNING, 4 nodes idle {back:.1f} s after `make run`; "
                f"repairs requested: {repairs[0][0]}"
            )
        stop(proc)
    finally:
        subprocess.run(
            [PY, "manage.py", "mtc", "daemons", "stop"], cwd=ROOT, env=env, capture_output=True
        )
        unix_accounts_remove(29800, 29899)
        shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(log.parent, ignore_errors=True)
    print(json.dumps({"rounds": figures}))


if __name__ == "__main__":
    main()
