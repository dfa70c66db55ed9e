"""Recovery from real faults under a running 2-node llama-pretrain job.

For each fault kind (kill, disk, slow, hang on the local provider), inject it on one of
the job's nodes and print the timeline: fault -> detected -> repair started (drain) ->
job requeued -> job running again -> first new training step, and the steps lost.
Over several runs, the medians.

    .venv/bin/python bench/recovery.py [--runs 3] [--kinds kill,disk,slow,hang]

`hang` stops one rank (SIGSTOP); the job is hung once it made no progress for
max(5 x median step time, MTC_HANG_FLOOR_S): "detected" is when the poller found it
(its stacks taken, its node marked JOB_HANG, the job requeued without that node), so
with the default floor of 60 s it measures the floor plus up to one poll round and the
stacks' few seconds; `--hang-floor` sets a lower floor for this run.

The control plane's loops run in this process at their production cadence: the
poller every 2 s (jobs, metrics, controller-side health), the node agents every 2 s
(their checks, run on demand here so the figures do not wait on a timer).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
TMP = tempfile.mkdtemp(prefix="mtc-bench-recovery-")
os.environ.update(MTC_DATA_DIR=TMP, MTC_CELERY_EAGER="1", MTC_LOCAL_NODE_AGENTS="0")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mtc.settings")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402

from clusters import services as cluster_services  # noqa: E402
from clusters.demo import DEMO_SPEC  # noqa: E402
from clusters.models import Cluster, Node  # noqa: E402
from clusters.providers import get_provider  # noqa: E402
from health.faults import fault_clear, fault_inject  # noqa: E402
from health.models import NodeFailure, Repair  # noqa: E402
from health.poll import cluster_health_poll  # noqa: E402
from health.selectors import goodput  # noqa: E402
from health.services import report_ingest  # noqa: E402
from jobs.models import Job, JobEvent, JobHang, JobMetric  # noqa: E402
from jobs.services import job_control, jobs_release_requeued  # noqa: E402
from jobs.sync import jobs_sync  # noqa: E402
from recipes.launch import recipe_launch  # noqa: E402
from recipes.tasks import recipe_round  # noqa: E402

TICK_S = 2.0


def tick(cluster, *, agents_on: list[str]) -> None:
    """One round of the control plane: the poller, and the named nodes' agents."""
    provider = get_provider("local")
    jobs_sync(cluster=cluster)
    recipe_round(cluster)  # metrics, then hangs
    jobs_release_requeued(cluster=cluster)
    for name in agents_on:
        node = Node.objects.get(cluster=cluster, name=name)
        report = provider.node_checks(cluster, node)
        if report:
            report_ingest(node=node, report=report)
    cluster_health_poll(cluster)


def one_run(cluster, owner, kind: str) -> dict:
    job = recipe_launch(
        cluster=cluster,
        recipe_id="llama-pretrain",
        owner=owner,
        body={"nodes": 2, "overrides": {"steps": 400, "checkpoint_interval": 10}},
    )
    while Job.objects.get(pk=job.pk).metrics.get("last_checkpoint_step", 0) < 20:
        tick(cluster, agents_on=[])
        time.sleep(0.5)
    job.refresh_from_db()
    names = (
        get_provider("local")
        .slurm(cluster)
        .run(["scontrol", "show", "hostnames", job.node_list])
        .stdout.split()
    )
    victim = Node.objects.get(cluster=cluster, name=names[-1])
    agents = (
        [victim.name]
        if kind == "disk"
        else (
            list(Node.objects.filter(cluster=cluster).values_list("name", flat=True))
            if kind == "slow"
            else []
        )
    )
    tick(cluster, agents_on=[])
    step_at_fault = Job.objects.get(pk=job.pk).metrics.get("step", 0)
    fault_time = time.time()
    since = datetime.fromtimestamp(fault_time, tz=UTC)
    fault_inject(node=victim, kind=kind)
    running_again = None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        tick(cluster, agents_on=agents)
        current = Job.objects.get(pk=job.pk)
        repair = Repair.objects.filter(node=victim, create_time__gte=since).first()
        if repair and repair.jobs_requeued and current.state == "RUNNING" and not running_again:
            running_again = time.time()
        hang = JobHang.objects.filter(job=job, detected_time__gte=since).first()
        if (
            kind == "hang"
            and hang is not None
            and hang.state == JobHang.REQUEUED
            and current.state == "RUNNING"
            and current.start_time
            and current.start_time > hang.detected_time
            and not running_again
        ):
            running_again = time.time()
        resumed = current.metrics.get("resumed_from_step")
        if (
            running_again
            and resumed is not None
            and JobMetric.objects.filter(
                job=job, step__gt=resumed, time__gt=datetime.fromtimestamp(running_again, tz=UTC)
            ).exists()
        ):
            break
        time.sleep(0.2 if running_again else TICK_S / 4)
    failure = (
        NodeFailure.objects.filter(node=victim, first_seen__gte=since)
        .order_by("first_seen")
        .first()
    )
    repair = (
        Repair.objects.filter(node=victim, create_time__gte=since).order_by("create_time").first()
    )
    requeued = (
        JobEvent.objects.filter(job=job, time__gte=since)
        .filter(cause__startswith="interrupted: hung" if kind == "hang" else "interrupted")
        .first()
    )
    hang = JobHang.objects.filter(job=job, detected_time__gte=since).first()
    if hang is not None:  # found by the poller's hang check, not by the node's health
        failure = failure or NodeFailure.objects.filter(node=victim, mode="JOB_HANG").first()
    resumed_from = Job.objects.get(pk=job.pk).metrics.get("resumed_from_step")
    first_step = (
        JobMetric.objects.filter(job=job, time__gt=datetime.fromtimestamp(running_again, tz=UTC))
        .order_by("time")
        .first()
        if running_again
        else None
    )
    row = {
        "kind": kind,
        "node": victim.name,
        "mode": failure.mode if failure else "-",
        "action": repair.action if repair else "-",
        "detected": (
            hang.detected_time.timestamp() - fault_time
            if hang is not None
            else (failure.first_seen.timestamp() - fault_time if failure else None)
        ),
        "drained": repair.start_time.timestamp() - fault_time if repair else None,
        "requeued": requeued.time.timestamp() - fault_time if requeued else None,
        "running": running_again - fault_time if running_again else None,
        "first_step": first_step.time.timestamp() - fault_time if first_step else None,
        # Steps done before the fault that the resumed run trains again.
        "steps_lost": max(0, step_at_fault - resumed_from) if resumed_from is not None else None,
        "resumed_from": resumed_from,
    }
    try:
        job_control(job=Job.objects.get(pk=job.pk), action="cancel", actor="bench")
    except Exception:  # noqa: BLE001 - already ended
        pass
    fault_clear(node=victim)
    return row


def fmt(value) -> str:
    return "-" if value is None else (f"{value:6.1f}" if isinstance(value, float) else str(value))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kinds", default="kill,disk,slow,hang")
    parser.add_argument(
        "--hang-floor", type=float, default=None, help="MTC_HANG_FLOOR_S for this run (s)"
    )
    args = parser.parse_args()
    from django.conf import settings

    if args.hang_floor is not None:
        settings.MTC_HANG_FLOOR_S = args.hang_floor
    print(f"hang floor (MTC_HANG_FLOOR_S): {settings.MTC_HANG_FLOOR_S:g} s")
    call_command("migrate", verbosity=0)
    owner = get_user_model().objects.create_user("bench", password="bench-pass-1")
    spec = dict(DEMO_SPEC, cluster_id="recovery")
    cluster_services.cluster_create(spec=spec, owner=owner)
    cluster = Cluster.objects.get(cluster_id="recovery")
    columns = (
        "kind",
        "node",
        "mode",
        "action",
        "detected",
        "drained",
        "requeued",
        "running",
        "first_step",
        "steps_lost",
        "resumed_from",
    )
    print(
        "seconds after the fault; steps lost: steps done before the fault that the job "
        "trains again (checkpoint interval 10)"
    )
    print("  ".join(f"{c:>12}" for c in columns))
    rows = []
    try:
        for kind in args.kinds.split(","):
            for _ in range(args.runs):
                row = one_run(cluster, owner, kind)
                rows.append(row)
                print("  ".join(f"{fmt(row[c]):>12}" for c in columns), flush=True)
        print()
        for kind in args.kinds.split(","):
            mine = [r for r in rows if r["kind"] == kind and r["running"] is not None]
            if mine:
                print(
                    f"{kind}: median fault -> running again "
                    f"{statistics.median(r['running'] for r in mine):.1f} s, "
                    f"-> first new step {statistics.median(r['first_step'] for r in mine):.1f} s,"
                    f" most steps lost {max(r['steps_lost'] or 0 for r in mine)} "
                    f"over {len(mine)} run(s)"
                )
        jobs_sync(cluster=cluster)  # the cancelled jobs' last states, for their GPU time
        good = goodput("recovery")
        if good["goodput"] is not None:
            print(
                f"goodput (health.selectors.goodput) over these runs: {100 * good['goodput']:.1f}%"
                f" of {good['held_gpu_s']:.0f} GPU-s held by {good['jobs']} job(s); lost "
                f"{good['restart_gpu_s']:.0f} restarting + {good['redo_gpu_s']:.0f} redoing "
                f"steps over {good['interruptions']} interruption(s)"
            )
    finally:
        get_provider("local").delete_cluster(cluster)
        shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    main()
