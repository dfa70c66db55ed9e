"""Jobs at scale on a real local cluster: 10,000 held array tasks.

Prints: squeue formatted output vs --json (read + parse), the poller's full sync
(first: creating every row; then steady state), server time and query count of
the job list API and the queue page at 10,000 jobs, and submit times: raw sbatch,
the adapter's submit through slurmrestd, and the API's submit, with the ratio the
issue asks for (API submit / raw sbatch).

    .venv/bin/python bench/jobs_scale.py [--jobs 10000] [--submits 120] [--submit-only]
                                         [--history 1000000 [--analyze]]

--history N: only the poll figures, and the steady-state poll again once N finished
(settled) rows of the same cluster are in the database: a round reads the queue and
the unsettled rows only, so its time should not follow the history (acceptance: at
most 1.2x the time with none).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
TMP = tempfile.mkdtemp(prefix="mtc-bench-jobs-")
os.environ["MTC_DATA_DIR"] = TMP
os.environ["MTC_CELERY_EAGER"] = "1"
# Node health agents (a check every few seconds on every node) would only compete
# with what is measured here for the cores.
os.environ.setdefault("MTC_LOCAL_NODE_AGENTS", "0")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mtc.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.urls import NoReverseMatch, reverse  # noqa: E402

from clusters import services as cluster_services  # noqa: E402
from clusters.demo import DEMO_SPEC  # noqa: E402
from clusters.models import Cluster  # noqa: E402
from clusters.providers import get_provider  # noqa: E402
from jobs.models import Job  # noqa: E402
from jobs.services import cluster_job_dirs  # noqa: E402
from jobs.sync import jobs_sync  # noqa: E402
from slurm.submit import Submission, sbatch_args  # noqa: E402


def timed(fn, repeat: int = 5) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def server_time(client: Client, url: str, repeat: int = 7) -> tuple[float, int, int]:
    client.get(url)  # warm caches
    with CaptureQueriesContext(connection) as ctx:
        status = client.get(url).status_code
    queries = len(ctx.captured_queries)
    median, _ = timed(lambda: client.get(url), repeat)
    return median, queries, status


def compare_queue_reads(client_slurm, label: str) -> None:
    """Both ways of reading the queue, on the same queue, to the same job list."""
    fmt, queue = timed(client_slurm.queue)
    js, queue_json = timed(client_slurm.queue_json, repeat=3)
    pending = {j.job_id for j in queue if j.state == "PENDING"}
    assert pending == {j.job_id for j in queue_json if j.state == "PENDING"}
    print(
        f"{label} ({len(queue)} jobs listed): squeue -O (formatted) + parse "
        f"{fmt * 1000:7.1f} ms | squeue --json + parse {js * 1000:7.1f} ms ({js / fmt:.1f}x)"
    )


def _poll_times(cluster: Cluster) -> dict[str, list[float]]:
    """9 steady-state polls, whole (squeue + database) and the database part alone
    (the queue read once beforehand), interleaved so load drift hits both alike."""
    queue = get_provider("local").slurm(cluster).queue()
    times: dict[str, list[float]] = {"poll": [], "db": []}
    for _ in range(9):
        for label, fn in (
            ("poll", lambda: jobs_sync(cluster=cluster)),
            ("db", lambda: jobs_sync(cluster=cluster, queue=queue)),
        ):
            start = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - start)
    return times


def list_counts(web: Client, cluster: Cluster, rows: int) -> None:
    """The operator's job list, page 1, counted by COUNT(*) and from the cluster's tally
    (jobs/tally.py; it needs the Redis at REDIS_URL, else both count)."""
    url = f"/api/v1/clusters/{cluster.cluster_id}/jobs"
    kept = settings.MTC_JOB_TALLY
    print(f"job list API, page 1, at {rows:,} finished (server time, median of 7):")
    try:
        for on, how in ((False, "COUNT(*)"), (True, "tally")):
            settings.MTC_JOB_TALLY = on
            median, queries, status = server_time(web, url)
            print(f"  {how:<9} {median * 1000:7.1f} ms  {queries:2d} queries  (HTTP {status})")
    finally:
        settings.MTC_JOB_TALLY = kept


def poll_with_history(cluster: Cluster, rows: int, *, web: Client, analyze: bool = False) -> None:
    """The steady-state poll without history, with ``rows`` finished, settled jobs of
    the same cluster (bulk, 20,000 a statement), and without them again (deleted):
    the machine's load drifts, so 'none' is measured on both sides."""
    from django.db import transaction
    from django.utils import timezone

    from mtc.db import bulk_insert

    for _ in range(3):  # the daemons settle after the submits; caches warm
        jobs_sync(cluster=cluster)
    before = _poll_times(cluster)
    start = time.perf_counter()
    now = timezone.now()
    base = 10_000_000  # ids clear of the queue's
    batch = 20_000
    for first in range(0, rows, batch):
        with transaction.atomic():
            bulk_insert(
                Job,
                [
                    {
                        "cluster_id": cluster.pk,
                        "job_id": str(base + i),
                        "job_number": base + i,
                        "name": "history",
                        "user": "root",
                        "partition": "gpu",
                        "state": "COMPLETED",
                        "exit_code": "0:0",
                        "submit_time": now,
                        "end_time": now,
                        "elapsed_s": 60,
                        "settled": True,
                        "update_time": now,
                    }
                    for i in range(first, min(rows, first + batch))
                ],
            )
    print(f"\ninserted {rows:,} finished rows in {time.perf_counter() - start:.1f} s")
    if analyze:  # planner statistics; mtc's own database has none (nothing runs ANALYZE)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    jobs_sync(cluster=cluster)
    with_history = _poll_times(cluster)
    with CaptureQueriesContext(connection) as ctx:
        jobs_sync(cluster=cluster)
    queries = len(ctx.captured_queries)
    list_counts(web, cluster, rows)
    start = time.perf_counter()
    Job.objects.filter(cluster=cluster, job_number__gte=base)._raw_delete(connection.alias)
    print(f"deleted them again in {time.perf_counter() - start:.1f} s")
    after = _poll_times(cluster)
    print("steady-state poll at the queue above (ms; median and min of 9 each):")
    for label, what in (("poll", "squeue + database"), ("db", "database part alone")):
        none = sorted(before[label] + after[label])
        none_med, none_min = statistics.median(none), none[0]
        hist_med, hist_min = statistics.median(with_history[label]), min(with_history[label])
        print(
            f"  {what:<20} none {none_med * 1000:7.1f} (min {none_min * 1000:6.1f})"
            f"  {rows:,} finished {hist_med * 1000:7.1f} (min {hist_min * 1000:6.1f})"
            f"  ratio {hist_med / none_med:.2f} (min/min {hist_min / none_min:.2f})"
        )
    print(f"  {queries} queries a round either way; acceptance: whole poll ratio at most 1.2")


def compare_submits(web: Client, cluster: Cluster, client_slurm, env: dict, repeat: int) -> None:
    """Raw sbatch, the adapter's REST submit and the API's submit of the same tiny job,
    interleaved (each round in a rotating order) so drift hits all three alike."""
    script = "#!/bin/bash\ntrue\n"
    body = {"name": "bench", "script": script, "dependency": "singleton"}
    output_dir, work_dir = cluster_job_dirs(cluster)
    args = sbatch_args(
        Submission(name="bench", script=script, dependency="singleton"),
        output_dir=str(output_dir),
        work_dir=str(work_dir),
        comment="mtc-owner=admin",
    )
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")}
    job_env = {**base, "MTC_CLUSTER": cluster.cluster_id, "SLURM_CONF": client_slurm.conf_path}

    def raw() -> None:
        subprocess.run(
            [
                "sbatch",
                "--parsable",
                "--job-name=bench",
                "--dependency=singleton",
                "-o",
                "/dev/null",
            ],
            input=script,
            text=True,
            env=env,
            check=True,
            capture_output=True,
        )

    def rest() -> None:
        client_slurm.submit_rest(args, script, job_env, str(work_dir))

    def api() -> None:
        response = web.post("/api/v1/clusters/jobs/jobs", body, content_type="application/json")
        assert response.status_code == 201, response.content

    ways = {"raw sbatch": raw, "REST submit (adapter)": rest, "API submit": api}
    for fn in ways.values():  # warm up: first connection, first queries
        fn()
    times: dict[str, list[float]] = {name: [] for name in ways}
    names = list(ways)
    for i in range(repeat):
        for name in names[i % 3 :] + names[: i % 3]:
            start = time.perf_counter()
            ways[name]()
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"\nsubmit, median of {repeat} (one singleton chain, tiny script):")
    for name, median in medians.items():
        q1, _, q3 = statistics.quantiles(times[name], n=4)
        print(f"  {name:<24} {median * 1000:6.2f} ms  (IQR {q1 * 1000:.2f}-{q3 * 1000:.2f})")
    ratio = medians["API submit"] / medians["raw sbatch"]
    print(f"  API submit / raw sbatch: {ratio:.2f} (acceptance: within 1.3)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--submits", type=int, default=120, help="submits per way, measured")
    parser.add_argument(
        "--submit-only", action="store_true", help="only the submit comparison (no 10k queue)"
    )
    parser.add_argument(
        "--history", type=int, default=0, help="finished rows to add for a second steady poll"
    )
    parser.add_argument(
        "--analyze",
        action="store_true",
        help="ANALYZE after adding the history (SQLite's planner then has statistics)",
    )
    parser.add_argument(
        "--distinct",
        type=int,
        default=3000,
        help="separate (non-array) jobs for the squeue comparison",
    )
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    settings.ALLOWED_HOSTS.append("testserver")
    from django.contrib.auth import get_user_model

    admin = get_user_model().objects.create_superuser("admin", "a@localhost", "bench-pass")
    spec = dict(DEMO_SPEC, cluster_id="jobs", node_pools=DEMO_SPEC["node_pools"])
    spec["orchestrator_spec"] = {
        "slurm_spec": dict(
            DEMO_SPEC["orchestrator_spec"]["slurm_spec"],
            config_overrides={"MaxJobCount": "100000", "MaxArraySize": "100001"},
        )
    }
    cluster_services.cluster_create(spec=spec, owner=admin)
    cluster = Cluster.objects.get(cluster_id="jobs")
    provider = get_provider("local")
    client_slurm = provider.slurm(cluster)
    env = dict(os.environ, SLURM_CONF=client_slurm.conf_path)
    web = Client()
    web.force_login(admin)
    try:
        if args.submit_only:
            compare_submits(web, cluster, client_slurm, env, args.submits)
            return
        per_array = 1000
        start = time.perf_counter()
        for first in range(0, args.jobs, per_array):
            count = min(per_array, args.jobs - first)
            subprocess.run(
                [
                    "sbatch",
                    "--hold",
                    f"--array=0-{count - 1}",
                    "-o",
                    "/dev/null",
                    "--job-name",
                    f"sweep-{first}",
                    "--wrap",
                    "true",
                ],
                env=env,
                check=True,
                capture_output=True,
            )
        print(f"queued {args.jobs} held array tasks in {time.perf_counter() - start:.1f} s")

        compare_queue_reads(client_slurm, f"{args.jobs} tasks of 10 pending arrays")

        start = time.perf_counter()
        stats = jobs_sync(cluster=cluster)
        first_sync = time.perf_counter() - start
        steady, _ = timed(lambda: jobs_sync(cluster=cluster))
        with CaptureQueriesContext(connection) as ctx:
            jobs_sync(cluster=cluster)
        print(f"full sync, first (creates {stats['created']} rows): {first_sync * 1000:7.1f} ms")
        print(
            f"full sync, steady state (squeue + compare):  {steady * 1000:7.1f} ms, "
            f"{len(ctx.captured_queries)} queries"
        )
        if args.history:  # the history would change every figure after this one
            poll_with_history(cluster, args.history, web=web, analyze=args.analyze)
            return
        Job.objects.update(owner=admin, submitted_by_mtc=True)

        print(f"\nat {Job.objects.count()} jobs (server time, median of 7; query count):")
        urls = {
            "list API (page 1)": "/api/v1/clusters/jobs/jobs",
            "list API (page 100, state filter)": (
                "/api/v1/clusters/jobs/jobs?state=PENDING&page=100"
            ),
        }
        try:
            urls["queue page"] = reverse("jobs:queue", args=["jobs"])
            urls["queue page (page 100)"] = reverse("jobs:queue", args=["jobs"]) + "?page=100"
        except NoReverseMatch:
            print("  (no queue page in this build)")
        for label, url in urls.items():
            median, queries, status = server_time(web, url)
            print(f"  {label:<36} {median * 1000:7.1f} ms  {queries:2d} queries  (HTTP {status})")

        subprocess.run(["scancel", "--state=PENDING", "--user=root"], env=env, check=True)
        if args.distinct:
            start = time.perf_counter()
            with ThreadPoolExecutor(4) as pool:
                list(
                    pool.map(
                        lambda i: subprocess.run(
                            [
                                "sbatch",
                                "--hold",
                                "-o",
                                "/dev/null",
                                f"--job-name=one-{i}",
                                "--wrap",
                                "true",
                            ],
                            env=env,
                            check=True,
                            capture_output=True,
                        ),
                        range(args.distinct),
                    )
                )
            print(
                f"\nqueued {args.distinct} separate held jobs in "
                f"{time.perf_counter() - start:.1f} s"
            )
            compare_queue_reads(client_slurm, f"{args.distinct} separate jobs")
            subprocess.run(["scancel", "--state=PENDING", "--user=root"], env=env, check=True)
        jobs_sync(cluster=cluster)
        compare_submits(web, cluster, client_slurm, env, args.submits)
    finally:
        provider.delete_cluster(cluster)
        shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    main()
