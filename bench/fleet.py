"""Fleet scale: agents' reports through HTTP, and the node pages of a 2,000-node cluster.

    .venv/bin/python bench/fleet.py [--nodes 2000] [--interval 10] [--seconds 30]
        [--clients 16] [--page-runs 10]

Starts its own Redis and web server (gunicorn, as `make run` does, with
MTC_SERVER_TIMING=1 so each response carries its server time and query count) in a
temporary data dir (SQLite, or DATABASE_URL's database when set), and makes the rows
itself: a RUNNING cluster of --nodes GPU nodes, each with its own node token, and a
5-node one to compare query counts with. No Slurm is started.

Reports: one real agent round (the agent, --once, on an emulated 2-GPU node), sent
for every node every --interval seconds with the node's name, a fresh time and its
token, by --clients kept-alive connections. Prints reports/s, p50/p99 and errors, then
for the cluster page, its node grid (the live fragment) and the nodes API: server ms
(median, max) and queries, for the big cluster and the small one.
Targets (issue 13): >= 200 reports/s; each page <= 150 ms, queries the same at 5 nodes.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from mtc.devstack import Stack, free_port  # noqa: E402

NODE_MARK = "NODE-NAME-MARK"
TIME_MARK = 1234567890.5


def agent_round(tmp: Path) -> dict:
    """One round of every check of the real agent on an emulated 2-GPU node."""
    from node.agent import mtc_agent
    from node.shim import install

    install.install(tmp / "n", 2, "NVIDIA_H200_141GB")
    config = json.loads((tmp / "n" / "agent.json").read_text())
    config.update({"speed_seconds": 0.05, "speed_size": 32})
    (tmp / "n" / "agent.json").write_text(json.dumps(config))
    pybin = tmp / "pybin"
    pybin.mkdir()
    (pybin / "python3").symlink_to(os.path.realpath(sys.executable))
    proc = subprocess.run(
        [sys.executable, "-S", mtc_agent.__file__, "--node", NODE_MARK]
        + ["--config", str(tmp / "n" / "agent.json"), "--once"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PATH=f"{pybin}{os.pathsep}{os.environ.get('PATH', '')}"),
        timeout=120,
    )
    return json.loads(proc.stdout.splitlines()[-1])


def rows_create(cluster_id: str, nodes: int) -> dict[str, str]:
    """The cluster's rows (bulk) and a token for each node: {node name: token}."""
    from django.db import transaction

    from clusters.models import Cluster, Node, NodePool
    from clusters.services import node_token_issue
    from clusters.spec import validate_cluster_spec

    spec = {
        "cluster_id": cluster_id,
        "provider": "local",
        "node_pools": [
            {
                "id": "login",
                "machine_spec": {"machine_type": "local-2"},
                "scaling_spec": {"min_node_count": 1, "max_node_count": 1},
            },
            {
                "id": "gpu",
                "machine_spec": {
                    "machine_type": "local-2",
                    "accelerator_type": "NVIDIA_H200_141GB",
                    "accelerator_count": 2,
                },
                "scaling_spec": {"min_node_count": 4, "max_node_count": 4},
            },
        ],
        "orchestrator_spec": {
            "slurm_spec": {
                "login_node_pool_id": "login",
                "partitions": [{"id": "gpu", "node_pool_ids": ["gpu"], "default": True}],
            }
        },
    }
    # Validated at a size the local provider takes, then given the bench's size (the
    # rows stand for a cloud cluster's; no daemons are started).
    spec = validate_cluster_spec(spec)
    spec["node_pools"][1]["scaling_spec"] = {"min_node_count": nodes, "max_node_count": nodes}
    cluster = Cluster.objects.create(cluster_id=cluster_id, spec=spec, state="RUNNING")
    NodePool.objects.create(cluster=cluster, pool_id="login", machine_type="local-2", is_login=True)
    pool = NodePool.objects.create(
        cluster=cluster,
        pool_id="gpu",
        machine_type="local-2",
        accelerator_type="NVIDIA_H200_141GB",
        accelerator_count=2,
        partitions=["gpu"],
        target_node_count=nodes,
    )
    Node.objects.bulk_create(
        Node(
            cluster=cluster,
            pool=pool,
            index=i,
            name=f"{cluster_id}-gpu-{i}",
            partition="gpu",
            gpus=2,
            gpu_type="h200",
            gpus_emulated=True,
            lifecycle="ACTIVE",
            slurm_state="IDLE",
        )
        for i in range(nodes)
    )
    with transaction.atomic():
        return {n.name: node_token_issue(n) for n in Node.objects.filter(cluster=cluster)}


class Conn:
    """One kept-alive connection; reconnects after an error."""

    def __init__(self, port: int):
        self.port = port
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: bytes | None, headers: dict):
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            self.conn.request(method, path, body=body, headers=headers)
            response = self.conn.getresponse()
            return response.status, response.read(), response.getheader("Server-Timing", "")
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = None
            raise


def reports_send(port, cluster_id, tokens, template: bytes, args) -> None:
    names = list(tokens)
    gap = args.interval / len(names)  # node i reports at i * gap within each round
    total = int(args.seconds / args.interval) * len(names)
    lock = threading.Lock()
    state = {"next": 0}
    latencies: list[float] = []
    server_ms: list[float] = []
    errors: dict[str, int] = {}
    start = time.perf_counter() + 0.5

    def worker() -> None:
        conn = Conn(port)
        while True:
            with lock:
                k = state["next"]
                if k >= total:
                    return
                state["next"] = k + 1
            wait = start + k * gap - time.perf_counter()
            if wait > 0:
                time.sleep(wait)  # pacing: each simulated node keeps its own interval
            name = names[k % len(names)]
            body = template.replace(NODE_MARK.encode(), name.encode()).replace(
                repr(TIME_MARK).encode(), repr(time.time()).encode()
            )
            headers = {
                "Content-Type": "application/json",
                "Authorization": "Bearer " + tokens[name],
            }
            path = f"/api/v1/clusters/{cluster_id}/nodes/{name}/health/report"
            sent = time.perf_counter()
            try:
                status, _, timing = conn.request("POST", path, body, headers)
            except Exception as exc:  # noqa: BLE001 - counted, the run goes on
                status, timing = type(exc).__name__, ""
            took = time.perf_counter() - sent
            with lock:
                if status == 202:
                    latencies.append(took)
                    if timing.startswith("app;dur="):
                        server_ms.append(float(timing.split(";dur=")[1].split(",")[0]))
                else:
                    errors[str(status)] = errors.get(str(status), 0) + 1

    threads = [threading.Thread(target=worker) for _ in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    latencies.sort()
    ms = [x * 1000 for x in latencies]
    print(
        f"reports: {len(names)} nodes every {args.interval:g} s for {args.seconds:g} s "
        f"({len(template)} bytes each), {args.clients} connections"
    )
    print(
        f"  {len(latencies)} stored in {elapsed:.1f} s: {len(latencies) / elapsed:.1f} reports/s "
        f"(offered {len(names) / args.interval:.0f}/s)"
    )
    if ms:
        print(
            f"  latency p50 {ms[len(ms) // 2]:.1f} ms, p99 {ms[int(len(ms) * 0.99)]:.1f} ms, "
            f"max {ms[-1]:.1f} ms; server p50 {statistics.median(server_ms):.1f} ms"
        )
    print(f"  errors: {sum(errors.values())} {errors or ''}")


def pages(port: int, cookie: str, clusters: list[tuple[str, int]], runs: int) -> None:
    conn = Conn(port)
    headers = {"Cookie": f"sessionid={cookie}", "Accept": "text/html,application/json"}
    print(f"pages ({runs} runs each; server time from Server-Timing):")
    print(f"  {'page':<34} {'nodes':>5} {'median ms':>9} {'max ms':>7} {'queries':>7}")
    for label, path in (
        ("cluster page", "/clusters/{c}/"),
        ("node grid (live fragment)", "/clusters/{c}/fragment/"),
        ("nodes API (default page)", "/api/v1/clusters/{c}/nodes"),
        ("nodes API (page_size=500)", "/api/v1/clusters/{c}/nodes?page_size=500"),
        ("cluster API", "/api/v1/clusters/{c}"),
    ):
        for cluster_id, n in clusters:
            took, counts = [], set()
            for _ in range(runs + 1):
                status, body, timing = conn.request("GET", path.format(c=cluster_id), None, headers)
                if status != 200:
                    raise RuntimeError(f"{path}: HTTP {status} {body[:200]!r}")
                parts = dict(p.strip().split(";", 1) for p in timing.split(","))
                took.append(float(parts["app"].removeprefix("dur=")))
                counts.add(int(parts["db"].removeprefix('desc="').rstrip('"')))
            took = took[1:]  # the first warms the worker's caches
            print(
                f"  {label:<34} {n:>5} {statistics.median(took):>9.1f} {max(took):>7.1f} "
                f"{'/'.join(map(str, sorted(counts))):>7}"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--page-runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mtc-fleet-") as tmp:
        env = {"MTC_SERVER_TIMING": "1", "REDIS_URL": "", "MTC_LOG_LEVEL": "WARNING"}
        with Stack(Path(tmp) / "data", env=env) as stack:
            stack.start_redis()
            stack.manage("migrate", "--noinput", "-v0")
            os.environ.update(stack.env)
            import django

            django.setup()
            from django.contrib.auth import get_user_model
            from django.test import Client

            template = agent_round(Path(tmp))
            template["time"] = TIME_MARK
            body = json.dumps(template).encode()
            tokens = rows_create("fleet", args.nodes)
            rows_create("fleet-small", 5)
            operator = get_user_model().objects.create_user(
                "bench-operator", password="x", is_staff=True
            )
            client = Client()
            client.force_login(operator)
            cookie = client.cookies["sessionid"].value
            port = free_port()
            stack.start_web(port)
            database = os.environ.get("DATABASE_URL", "sqlite").split(":")[0]
            workers = os.environ.get("MTC_WEB_WORKERS") or os.cpu_count()
            print(f"web: gunicorn, {workers} workers; database: {database}")
            pages(port, cookie, [("fleet", args.nodes), ("fleet-small", 5)], args.page_runs)
            reports_send(port, "fleet", tokens, body, args)
            # Again with every node's history in place (and a report in every row).
            pages(port, cookie, [("fleet", args.nodes), ("fleet-small", 5)], args.page_runs)


if __name__ == "__main__":
    main()
