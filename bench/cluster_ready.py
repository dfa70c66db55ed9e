"""Seconds from `POST /api/v1/clusters` to every node idle in `sinfo`, for 4 and 16
nodes, through the whole stack: HTTP -> Django -> Redis -> Celery worker -> Slurm.

    .venv/bin/python bench/cluster_ready.py [--runs 3] [--sizes 4,16] [--fabric-check]

"All idle" is registration: every slurmd up, its first health check passed, the node idle
in `sinfo`. The create Operation then runs the admission fabric check (a torch process per
node) before it SUCCEEDS; that is off unless `--fabric-check` is given, since on a 2-core
machine 32 nodes' torch starts take minutes and say nothing about registration. As under
`make run`, the installation's slurmdbd and MariaDB run, and each cluster registers there.

Starts its own Redis, worker and web server in a temporary data dir, and stops
them (and deletes its clusters) at the end.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clusters.demo import DEMO_SPEC  # noqa: E402
from mtc.devstack import Stack, free_port, unix_accounts_remove  # noqa: E402

UIDS = "29900-29949"  # this bench's own accounts (local identity), removed after


def api(base: str, token: str, method: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        base + path,
        method=method,
        data=json.dumps(body).encode() if body else None,
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"{}")


def idle_nodes(conf: Path) -> int:
    proc = subprocess.run(
        ["sinfo", "--noheader", "--Node", "--format=%N %T"],
        capture_output=True,
        text=True,
        env=dict(os.environ, SLURM_CONF=str(conf)),
        timeout=10,
        check=False,
    )
    return sum(1 for line in proc.stdout.splitlines() if line.split()[-1:] == ["idle"])


def one_run(stack: Stack, base: str, token: str, nodes: int, run: int) -> tuple[float, float]:
    cluster_id = f"bench{nodes}-{run}"
    spec = copy.deepcopy(DEMO_SPEC)
    spec["cluster_id"] = cluster_id
    spec["node_pools"][1]["scaling_spec"] = {"min_node_count": nodes, "max_node_count": nodes}
    conf = stack.data_dir / "clusters" / cluster_id / "etc" / "slurm.conf"
    start = time.perf_counter()
    op = api(base, token, "POST", "/api/v1/clusters", spec)
    idle_at = None
    while time.perf_counter() - start < 120:
        if conf.exists() and idle_nodes(conf) == nodes:
            idle_at = time.perf_counter() - start
            break
        time.sleep(0.05)
    while api(base, token, "GET", f"/api/v1/operations/{op['id']}")["state"] != "SUCCEEDED":
        time.sleep(0.05)
    done_at = time.perf_counter() - start
    delete = api(base, token, "DELETE", f"/api/v1/clusters/{cluster_id}")
    while not api(base, token, "GET", f"/api/v1/operations/{delete['id']}")["done"]:
        time.sleep(0.1)
    if idle_at is None:
        raise RuntimeError(f"{cluster_id}: nodes never all idle")
    return idle_at, done_at


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="4,16")
    parser.add_argument("--fabric-check", action="store_true", help="run the admission check")
    parser.add_argument(
        "--no-accounting", action="store_true", help="no slurmdbd (make run starts one)"
    )
    args = parser.parse_args()
    env = {
        "MTC_ADMIN_PASSWORD": "bench-password",
        "REDIS_URL": "",
        "MTC_UID_RANGE": UIDS,
        "MTC_FABRIC_CHECK_ON_CREATE": "1" if args.fabric_check else "0",
    }
    try:
        run_all(args, env)
    finally:
        unix_accounts_remove(*map(int, UIDS.split("-")))


def run_all(args, env: dict[str, str]) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="mtc-bench-") as tmp,
        Stack(Path(tmp), env=env) as stack,
    ):
        stack.start_redis()
        if not args.no_accounting:
            print(f"accounting: {stack.start_accounting(free_port())}")
        stack.manage("migrate", "--noinput", "-v0")
        stack.manage("mtc", "bootstrap")
        token = stack.manage("drf_create_token", "admin").stdout.split()[2]
        stack.start_worker(beat=False)
        port = free_port()
        stack.start_web(port)
        base = f"http://127.0.0.1:{port}"
        print(f"fabric check on create: {'on' if args.fabric_check else 'off'}")
        print(f"{'nodes':>5}  {'POST -> all idle (s)':>22}  {'POST -> op SUCCEEDED (s)':>25}")
        for nodes in [int(n) for n in args.sizes.split(",")]:
            results = [one_run(stack, base, token, nodes, r) for r in range(args.runs)]
            idle = [r[0] for r in results]
            done = [r[1] for r in results]
            print(
                f"{nodes:>5}  median {statistics.median(idle):6.2f} (min {min(idle):.2f})"
                f"  median {statistics.median(done):6.2f} (min {min(done):.2f})"
            )


if __name__ == "__main__":
    main()
