"""Inference through mtc's route against calling the replica directly: requests/s and
p50/p99 latency for the tiny model, and the routing overhead ratio.

    .venv/bin/python bench/inference.py [--requests 300] [--concurrency 1,4] [--max-tokens 8]

Starts its own Redis, Celery worker + beat (the job poller and the serving reconcile)
and web server in a temporary data dir, creates a 1-node local cluster, builds a tiny
Llama (nothing downloaded), registers it and deploys it as a 1-replica endpoint through
the API. The same requests then go to the replica (its bearer token) and to
POST /api/v1/endpoints/<id>/completions (an API token), over kept-alive connections.
At the end it deletes the endpoint and the cluster and stops every process it started.
"""

from __future__ import annotations

import argparse
import copy
import http.client
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
TMP = Path(tempfile.mkdtemp(prefix="mtc-bench-inference-"))
os.environ.update(MTC_DATA_DIR=str(TMP / "data"), MTC_LOCAL_NODE_AGENTS="0")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mtc.settings")

from clusters.demo import DEMO_SPEC  # noqa: E402
from mtc.devstack import Stack, free_port  # noqa: E402

BODY = {"prompt": "hello world, the quick brown fox", "temperature": 0}


def api(base: str, token: str, method: str, path: str, body: dict | None = None) -> dict:
    import urllib.request

    request = urllib.request.Request(
        base + path,
        method=method,
        data=json.dumps(body).encode() if body else None,
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read() or b"{}")


def wait(what: str, condition, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


def load(
    host: str,
    port: int,
    path: str,
    auth: str,
    body: dict,
    total: int,
    threads: int,
    *,
    keepalive: bool,
):
    """``total`` requests from ``threads`` clients, each on its own connection (kept
    alive, or dialled anew per request). Returns (requests/s, sorted latencies in ms)."""
    payload = json.dumps(body).encode()
    headers = {"Authorization": auth, "Content-Type": "application/json"}
    latencies: list[float] = []
    errors: list[str] = []
    counter = iter(range(total))
    lock = threading.Lock()

    def client() -> None:
        conn = http.client.HTTPConnection(host, port, timeout=60)
        while True:
            with lock:
                if next(counter, None) is None:
                    break
            started = time.perf_counter()
            try:
                conn.request("POST", path, body=payload, headers=headers)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException):
                conn.close()  # the server closed a kept-alive connection: dial again
                conn = http.client.HTTPConnection(host, port, timeout=60)
                conn.request("POST", path, body=payload, headers=headers)
                response = conn.getresponse()
                data = response.read()
            elapsed = (time.perf_counter() - started) * 1000
            if not keepalive:
                conn.close()  # the next request dials again
            with lock:
                if response.status == 200:
                    latencies.append(elapsed)
                else:
                    errors.append(f"{response.status}: {data[:200]!r}")
        conn.close()

    started = time.perf_counter()
    workers = [threading.Thread(target=client) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed, e.g. {errors[0]}")
    return len(latencies) / wall, sorted(latencies)


def pct(values: list[float], q: float) -> float:
    return values[max(0, int(round(q / 100 * len(values) + 0.5)) - 1)]


def deploy(base: str, token: str) -> tuple[int, float]:
    """Register the tiny model and deploy it; returns (endpoint id, seconds to first answer)."""
    import django

    django.setup()
    from registry.models import Model, ModelVersion
    from tests.test_serving_support import tiny_model_save

    export = tiny_model_save(TMP / "tiny-model")
    model = Model.objects.create(name="tiny")
    ModelVersion.objects.create(model=model, number=1, state="READY", export_path=str(export))
    started = time.monotonic()
    endpoint = api(
        base,
        token,
        "POST",
        "/api/v1/endpoints",
        {"model": "tiny", "version": 1, "cluster": "bench", "min_replicas": 1, "max_replicas": 1},
    )
    path = f"/api/v1/endpoints/{endpoint['id']}"
    wait("the endpoint to be READY", lambda: api(base, token, "GET", path)["state"] == "READY")
    api(base, token, "POST", f"{path}/completions", {**BODY, "max_tokens": 1})
    return endpoint["id"], time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()
    body = {**BODY, "max_tokens": args.max_tokens}
    stack = Stack(TMP / "data", env={"MTC_ADMIN_PASSWORD": "bench-password", "REDIS_URL": ""})
    base = ""
    token = ""
    try:
        stack.start_redis()
        os.environ["REDIS_URL"] = stack.env["REDIS_URL"]
        stack.manage("migrate", "--noinput", "-v0")
        stack.manage("mtc", "bootstrap")
        token = stack.manage("drf_create_token", "admin").stdout.split()[2]
        stack.start_worker(beat=True)
        port = free_port()
        stack.start_web(port)
        base = f"http://127.0.0.1:{port}"

        spec = copy.deepcopy(DEMO_SPEC)
        spec.update(cluster_id="bench", display_name="inference bench")
        spec["node_pools"][1]["scaling_spec"] = {"min_node_count": 1, "max_node_count": 1}
        op = api(base, token, "POST", "/api/v1/clusters", spec)
        wait(
            "the cluster",
            lambda: api(base, token, "GET", f"/api/v1/operations/{op['id']}")["done"],
        )
        endpoint_id, ready_s = deploy(base, token)
        from serving.models import Endpoint

        endpoint = Endpoint.objects.get(pk=endpoint_id)
        detail = api(base, token, "GET", f"/api/v1/endpoints/{endpoint_id}")
        replica_host, replica_port = detail["replicas"][0]["address"].rsplit(":", 1)
        print(f"deploy -> first answer through mtc: {ready_s:.1f} s")
        print(f"tiny Llama (2 layers, hidden 32), {args.max_tokens} new tokens, greedy")
        targets = {
            "direct": (replica_host, int(replica_port), "/v1/completions",
                       f"Bearer {endpoint.replica_token}"),
            "mtc": ("127.0.0.1", port, f"/api/v1/endpoints/{endpoint_id}/completions",
                    f"Token {token}"),
        }  # fmt: skip
        print(
            f"{'connections':<12} {'clients':>7}  {'target':<7} {'req/s':>8} {'p50 ms':>8}"
            f" {'p99 ms':>8}  overhead (mtc / direct)"
        )
        for keepalive in (False, True):
            for threads in [int(c) for c in args.concurrency.split(",")]:
                results = {}
                for name, (host, target_port, path, auth) in targets.items():
                    # Warm up (connections, the replica's first generation), then measure.
                    load(host, target_port, path, auth, body, 10, threads, keepalive=keepalive)
                    results[name] = load(
                        host, target_port, path, auth, body, args.requests, threads,
                        keepalive=keepalive,
                    )  # fmt: skip
                mode = "kept alive" if keepalive else "new each"
                for name, (rps, lat) in results.items():
                    p50, p99 = pct(lat, 50), pct(lat, 99)
                    line = f"{mode:<12} {threads:>7}  {name:<7} {rps:>8.1f} {p50:>8.1f} {p99:>8.1f}"
                    if name == "mtc":
                        (direct_rps, direct), (routed_rps, routed) = results.values()
                        line += (
                            f"  p50 x{pct(routed, 50) / pct(direct, 50):.2f},"
                            f" throughput /{direct_rps / routed_rps:.2f}"
                            f" (+{statistics.median(routed) - statistics.median(direct):.1f} ms)"
                        )
                    print(line)
        api(base, token, "DELETE", f"/api/v1/endpoints/{endpoint_id}")
        wait(
            "the endpoint's replicas to stop",
            lambda: not Endpoint.objects.filter(pk=endpoint_id).exists(),
            timeout=60,
        )
    finally:
        if base:
            try:
                op = api(base, token, "DELETE", "/api/v1/clusters/bench")
                wait(
                    "the cluster's delete",
                    lambda: api(base, token, "GET", f"/api/v1/operations/{op['id']}")["done"],
                    timeout=120,
                )
            except Exception as exc:  # still stop everything below
                print(f"cluster delete: {exc}", file=sys.stderr)
        stack.stop_all()
        from clusters.providers import procs

        left = procs.processes_mentioning(str(TMP))
        if left:
            procs.stop(left)
        shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    main()
