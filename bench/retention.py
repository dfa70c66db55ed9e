"""A long run's metrics, read and purged: N stored steps of one recipe job (default
1,000,000; SQLite in a private data dir, or DATABASE_URL).

Prints: the metrics API's server time, query count and points at the default
?points=1000 (and a 500-step zoom), what the old read of every step took, and the
retention purge of the job (its rows 1,000 a DELETE, with its run directory): time,
rows a second, and the longest run (each is bounded by MTC_RETENTION_RUN_S).

    .venv/bin/python bench/retention.py [--steps 1000000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
TMP = tempfile.mkdtemp(prefix="mtc-bench-retention-")
os.environ["MTC_DATA_DIR"] = TMP
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mtc.settings")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from clusters.demo import DEMO_SPEC  # noqa: E402
from clusters.models import Cluster  # noqa: E402
from jobs.models import Job, JobMetric  # noqa: E402
from mtc import retention  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1_000_000)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench", password="x", is_staff=True)
    cluster = Cluster.objects.create(cluster_id="bench", spec=DEMO_SPEC, state="RUNNING")
    run_dir = Path(TMP) / "clusters" / "bench" / "runs" / "llama-pretrain-bench"
    (run_dir / "checkpoints").mkdir(parents=True)
    job = Job.objects.create(
        cluster=cluster,
        job_id="1",
        job_number=1,
        name="long",
        owner=user,
        recipe="llama-pretrain",
        state="COMPLETED",
        end_time=timezone.now() - timedelta(days=400),
        checkpoint_dir=str(run_dir / "checkpoints"),
        metrics={"step": args.steps},
    )
    start = time.perf_counter()
    batch = 20_000
    for first in range(1, args.steps + 1, batch):
        JobMetric.objects.bulk_create(
            JobMetric(job=job, step=s, values={"loss": 10.0 / s, "lr": 3e-4, "tokens_per_s": 1e4})
            for s in range(first, min(first + batch, args.steps + 1))
        )
    print(f"stored {args.steps:,} steps in {time.perf_counter() - start:.1f} s")

    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    url = f"/api/v1/clusters/bench/jobs/{job.job_id}/metrics"
    for label, query in (("default", ""), ("zoom 500", "?start_step=5000&end_step=5499")):
        client.get(url + query)  # warm
        with CaptureQueriesContext(connection) as ctx:
            start = time.perf_counter()
            body = client.get(url + query).json()
            took = time.perf_counter() - start
        print(
            f"metrics API ({label}): {took * 1000:.0f} ms, {len(ctx)} queries, "
            f"{len(body['series']):,} points, stride {body['stride']}"
        )
    start = time.perf_counter()
    every = sum(1 for _ in JobMetric.objects.filter(job=job).values_list("step", "values"))
    print(f"reading every step (before): {time.perf_counter() - start:.1f} s for {every:,} rows")

    runs, start, longest = 0, time.perf_counter(), 0.0
    while Job.objects.filter(pk=job.pk).exists():
        run_start = time.perf_counter()
        retention.purge_all(budget_s=20)
        longest = max(longest, time.perf_counter() - run_start)
        runs += 1
    took = time.perf_counter() - start
    print(
        f"purge: {args.steps:,} points + the job in {took:.1f} s over {runs} run(s) "
        f"({args.steps / took:,.0f} rows/s, longest run {longest:.1f} s), 1,000 rows a DELETE; "
        f"run dir gone: {not run_dir.exists()}"
    )


if __name__ == "__main__":
    main()
