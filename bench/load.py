"""The API under load: N clients (threads, each with its own kept-alive connection)
for S seconds against a running stack (`make run`), 90 % reads, 10 % job submits.

Reads, in turn: the cluster list, the cluster's jobs, its nodes, one job, the
operations. Submits: POST a tiny batch script (`true`) to the cluster's jobs.
Prints req/s, p50, p99 and max latency, errors, overall and per request kind, after a
warm-up (--warmup seconds, not counted).

    MTC_DATA_DIR=/tmp/run make run            # in another shell
    MTC_DATA_DIR=/tmp/run .venv/bin/python bench/load.py [--clients 50] [--seconds 60]
        [--url http://127.0.0.1:8000] [--token KEY] [--cluster demo]

Without --token (or MTC_TOKEN) it makes one: `manage.py drf_create_token admin`, with
the MTC_DATA_DIR (and DATABASE_URL) of this environment, so point them at the stack's.
Target (issue "A production control plane"): 0 errors, p99 <= 300 ms at 50 x 60 s.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from urllib.parse import urlparse

BASE_DIR = Path(__file__).resolve().parent.parent
SCRIPT = "#!/bin/bash\ntrue\n"


def token_create() -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", "drf_create_token", "admin"],
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()[2]  # "Generated token KEY for user admin"


class Client:
    """One kept-alive HTTP/1.1 connection; reconnects after an error."""

    def __init__(self, url: str, token: str):
        parsed = urlparse(url)
        self.host, self.port = parsed.hostname, parsed.port or 80
        self.headers = {"Authorization": f"Token {token}", "Accept": "application/json"}
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            self.conn.request(method, path, body=data, headers=headers)
            response = self.conn.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException):
            self.conn.close()
            self.conn = None
            raise


def first_job(client: Client, cluster: str) -> str:
    """A job to read: the newest of the cluster's, or one submitted now."""
    status, body = client.request("GET", f"/api/v1/clusters/{cluster}/jobs")
    if status == 200 and json.loads(body)["results"]:
        return json.loads(body)["results"][0]["job_id"]
    status, body = client.request("POST", *submit(cluster))
    if status != 201:
        raise SystemExit(f"submit failed ({status}): {body[:300]!r}")
    return json.loads(body)["job_id"]


def submit(cluster: str) -> tuple[str, dict]:
    return f"/api/v1/clusters/{cluster}/jobs", {"name": "load", "script": SCRIPT}


def run(args, token: str) -> None:
    probe = Client(args.url, token)
    status, body = probe.request("GET", f"/api/v1/clusters/{args.cluster}")
    if status != 200 or json.loads(body)["state"] != "RUNNING":
        raise SystemExit(f"cluster {args.cluster} is not RUNNING ({status}): {body[:300]!r}")
    job_id = first_job(probe, args.cluster)
    c = args.cluster
    reads = [
        ("clusters", "/api/v1/clusters"),
        ("jobs", f"/api/v1/clusters/{c}/jobs"),
        ("nodes", f"/api/v1/clusters/{c}/nodes"),
        ("job", f"/api/v1/clusters/{c}/jobs/{job_id}"),
        ("operations", "/api/v1/operations"),
    ]
    timeline: list[tuple[float, float, str]] = []  # (sent, seconds, kind) of each request
    errors: dict[str, int] = defaultdict(int)
    samples: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(args.clients + 1)
    stop_at = [0.0]
    count_from = [0.0]  # requests that start before this are the warm-up's

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        client = Client(args.url, token)
        start.wait()
        while time.monotonic() < stop_at[0]:
            if rng.random() < args.submit_share:
                kind, (path, body), method, ok = "submit", submit(c), "POST", 201
            else:
                (kind, path), body, method, ok = rng.choice(reads), None, "GET", 200
            began = time.perf_counter()
            try:
                status, data = client.request(method, path, body)
                error = None if status == ok else f"{kind}: HTTP {status} {data[:200]!r}"
            except (OSError, http.client.HTTPException) as exc:
                error = f"{kind}: {exc!r}"
            elapsed = time.perf_counter() - began
            if began < count_from[0]:
                continue
            with lock:
                timeline.append((began, elapsed, kind))
                if error:
                    errors[kind] += 1
                    if len(samples) < 5:
                        samples.append(error)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(args.clients)]
    for thread in threads:
        thread.start()
    measured_from = time.monotonic() + args.warmup
    count_from[0] = time.perf_counter() + args.warmup
    stop_at[0] = measured_from + args.seconds
    start.wait()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - measured_from
    latencies: dict[str, list[float]] = defaultdict(list)
    for _, elapsed, kind in timeline:
        latencies[kind].append(elapsed)
    report(args, latencies, errors, wall)
    if args.raw:
        args.raw.write_text(json.dumps(timeline))
    for line in samples:
        print(f"  error: {line}")


def pct(values: list[float], q: float) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def report(args, latencies, errors, wall: float) -> None:
    every = [v for vs in latencies.values() for v in vs]
    print(
        f"{args.clients} clients x {args.seconds:g} s against {args.url} "
        f"({1 - args.submit_share:.0%} reads, {args.submit_share:.0%} submits)"
    )
    head = ("requests", "req/s", "p50 ms", "p99 ms", "max ms")
    print(f"{'kind':<11} " + " ".join(f"{h:>8}" for h in head) + " errors")
    rows = sorted(latencies.items()) + [("all", every)]
    for kind, values in rows:
        if not values:
            continue
        n_errors = sum(errors.values()) if kind == "all" else errors[kind]
        print(
            f"{kind:<11} {len(values):>8} {len(values) / wall:>8.1f} {pct(values, 50) * 1e3:>8.1f}"
            f" {pct(values, 99) * 1e3:>8.1f} {max(values) * 1e3:>8.1f} {n_errors:>6}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("MTC_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("MTC_TOKEN", ""))
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--warmup", type=float, default=3, help="seconds not counted first")
    parser.add_argument("--cluster", default="demo")
    parser.add_argument("--submit-share", type=float, default=0.1)
    parser.add_argument(
        "--raw", type=Path, help="write each request as [sent (monotonic s), seconds, kind]"
    )
    args = parser.parse_args()
    run(args, args.token or token_create())


if __name__ == "__main__":
    main()
