"""A goodput soak: a 2-node llama-pretrain job on a 4-node pool (one node a hot spare
where the spec takes `spare_node_count`) runs for --minutes while a random fault hits one
of its nodes every --interval seconds, with no human action: detection, repair, requeue
and resume are mtc's own. Prints each fault with its detection and recovery times, and
the goodput: productive step time (each step the job kept, once, at its own step time) /
wall time from the first training step to the end.

    .venv/bin/python bench/soak.py [--minutes 20] [--interval 240] \
        [--kinds kill,disk,slow,straggle,hang,ecc] [--seed 1]

Kinds the local provider does not know are left out (and said so). The control plane's
loops run in this process: the poller every 2 s, every node's agent every 10 s, and the
operations (repairs) on a thread of their own (bench/operations_worker.py).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
TMP = tempfile.mkdtemp(prefix="mtc-bench-soak-")
os.environ.update(MTC_DATA_DIR=TMP, MTC_CELERY_EAGER="1", MTC_LOCAL_NODE_AGENTS="0")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mtc.settings")

import django  # noqa: E402

django.setup()

import operations_worker  # noqa: E402  (bench/, beside this script)
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402

from clusters import services as cluster_services  # noqa: E402
from clusters.demo import DEMO_SPEC  # noqa: E402
from clusters.models import Cluster, Node  # noqa: E402
from clusters.providers import get_provider  # noqa: E402
from clusters.spec import SpecError  # noqa: E402
from health.faults import fault_inject, fault_kinds  # noqa: E402
from health.models import NodeFailure  # noqa: E402
from health.poll import cluster_health_poll  # noqa: E402
from health.selectors import goodput  # noqa: E402
from health.services import report_ingest  # noqa: E402
from jobs.models import Job, JobEvent, JobHang, JobMetric  # noqa: E402
from jobs.services import job_control, jobs_release_requeued  # noqa: E402
from jobs.sync import jobs_sync  # noqa: E402
from recipes.launch import recipe_launch  # noqa: E402
from recipes.tasks import recipe_round  # noqa: E402

TICK_S, AGENT_EVERY_S = 2.0, 10.0
# How mtc records the requeue off a straggler it found (a JobEvent's cause).
STRAGGLER_CAUSE = "interrupted: straggler"
CLUSTER_ID = "soak"


def soak_spec(spares: int) -> dict:
    spec = {**DEMO_SPEC, "cluster_id": CLUSTER_ID}
    pools = []
    for pool in spec["node_pools"]:
        pool = dict(pool)
        if pool["id"] != spec["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"]:
            pool["scaling_spec"] = {"min_node_count": 4, "max_node_count": 4}
            if spares:
                pool["spare_node_count"] = spares
        pools.append(pool)
    return {**spec, "node_pools": pools}


class ControlPlane:
    """The poller and the node agents, as production runs them, in this process."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.provider = get_provider("local")
        self.last_agents = 0.0

    def tick(self) -> None:
        jobs_sync(cluster=self.cluster)
        recipe_round(self.cluster)  # metrics, stragglers, hangs
        jobs_release_requeued(cluster=self.cluster)
        if time.monotonic() - self.last_agents >= AGENT_EVERY_S:
            self.last_agents = time.monotonic()
            for node in Node.objects.filter(cluster=self.cluster):
                report = self.provider.node_checks(self.cluster, node)
                if report:
                    report_ingest(node=node, report=report)
        cluster_health_poll(self.cluster)


def job_nodes(cluster: Cluster, job: Job) -> list[str]:
    slurm = get_provider("local").slurm(cluster)
    return slurm.run(["scontrol", "show", "hostnames", job.node_list]).stdout.split()


def when(value: float | None) -> str:
    return "-" if value is None else f"{value:6.1f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--interval", type=float, default=240)
    parser.add_argument("--kinds", default="kill,disk,slow,straggle,hang,ecc")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    known = set(fault_kinds())
    kinds = [k for k in args.kinds.split(",") if k in known]
    missing = [k for k in args.kinds.split(",") if k not in known]
    if missing:
        print(f"left out (the local provider has no such fault): {', '.join(missing)}")
    chooser = random.Random(args.seed)

    call_command("migrate", verbosity=0)
    owner = get_user_model().objects.create_user("soak", password="soak-pass-1")
    try:
        cluster_services.cluster_create(spec=soak_spec(spares=1), owner=owner)
        spares = 1
    except SpecError:  # a spec without spare_node_count
        cluster_services.cluster_create(spec=soak_spec(spares=0), owner=owner)
        spares = 0
    cluster = Cluster.objects.get(cluster_id=CLUSTER_ID)
    operations_worker.start()  # repairs beside the poller, as the operations queue runs them
    operations_worker.start(
        operations_worker.POLL_TASKS, "polls-worker"
    )  # hang checks timed to a threshold
    plane = ControlPlane(cluster)
    print(
        f"pool of 4 nodes, {spares} spare; faults from {', '.join(kinds)} every "
        f"{args.interval:.0f} s for {args.minutes:.0f} min (seed {args.seed})"
    )
    job = recipe_launch(
        cluster=cluster,
        recipe_id="llama-pretrain",
        owner=owner,
        body={"nodes": 2, "overrides": {"steps": 1_000_000, "checkpoint_interval": 10}},
    )
    try:
        while not JobMetric.objects.filter(job=job).exists():
            plane.tick()
            time.sleep(TICK_S / 2)
        start = time.time()
        end = start + args.minutes * 60
        next_fault = start + args.interval
        faults: list[dict] = []
        open_fault: dict | None = None
        print(
            f"{'t':>6}  {'kind':>8}  {'node':>14}  {'mode':>16}  {'detected':>8}  "
            f"{'running':>8}  {'new step':>8}"
        )
        while time.time() < end:
            plane.tick()
            now = time.time()
            if open_fault:
                watch(open_fault, job)
                if open_fault["first_step"] is not None or now - open_fault["t"] > args.interval:
                    report(open_fault, start)
                    open_fault = None
            if now >= next_fault and open_fault is None:
                current = Job.objects.get(pk=job.pk)
                if current.state == "RUNNING" and current.node_list:
                    kind = chooser.choice(kinds)
                    victim = Node.objects.get(cluster=cluster, name=job_nodes(cluster, current)[-1])
                    fault_inject(node=victim, kind=kind)
                    open_fault = {
                        "kind": kind,
                        "node": victim,
                        "t": time.time(),
                        "detected": None,
                        "mode": "-",
                        "running": None,
                        "first_step": None,
                        "left_running": False,
                    }
                    faults.append(open_fault)
                    next_fault = time.time() + args.interval
            time.sleep(TICK_S)
        if open_fault:
            report(open_fault, start)
        wall = time.time() - start
        summary(job, faults, start, wall)
    finally:
        try:
            job_control(job=Job.objects.get(pk=job.pk), action="cancel", actor="soak")
        except Exception:  # noqa: BLE001 - already ended
            pass
        get_provider("local").delete_cluster(cluster)
        shutil.rmtree(TMP, ignore_errors=True)


def watch(fault: dict, job: Job) -> None:
    """Fill in the fault's times as they happen: detected (a failure on its node, or a
    hang or a straggler found in the job: that node's failure opens only once the job
    has left it), running again (the job RUNNING after leaving it), first new
    training step after that."""
    since = datetime.fromtimestamp(fault["t"], tz=UTC)
    if fault["mode"] == "-":
        failure = (
            NodeFailure.objects.filter(node=fault["node"], first_seen__gte=since)
            .order_by("first_seen")
            .first()
        )
        hang = JobHang.objects.filter(job=job, detected_time__gte=since).order_by("id").first()
        straggler = (
            JobEvent.objects.filter(job=job, time__gte=since, cause__startswith=STRAGGLER_CAUSE)
            .order_by("time")
            .first()
        )
        seen = [
            when
            for when in (
                failure and failure.first_seen,
                hang and hang.detected_time,
                straggler and straggler.time,
            )
            if when
        ]
        if seen:
            fault["detected"] = min(seen).timestamp() - fault["t"]
        if failure:
            fault["mode"] = failure.mode
    current = Job.objects.get(pk=job.pk)
    # A requeue onto a spare can be back to RUNNING between two looks: the job's own
    # record says it was interrupted, and a start after that is its running again.
    interrupted = (
        JobEvent.objects.filter(job=job, time__gte=since, cause__startswith="interrupted")
        .order_by("time")
        .first()
    )
    if current.state != "RUNNING" or interrupted is not None:
        fault["left_running"] = True
    if (
        fault["left_running"]
        and fault["running"] is None
        and current.state == "RUNNING"
        and current.start_time is not None
        and (interrupted is None or current.start_time >= interrupted.time)
        and current.start_time.timestamp() >= fault["t"]
    ):
        fault["running"] = current.start_time.timestamp() - fault["t"]
    if fault["running"] is not None and fault["first_step"] is None:
        after = datetime.fromtimestamp(fault["t"] + fault["running"], tz=UTC)
        if JobMetric.objects.filter(job=job, time__gt=after).exists():
            fault["first_step"] = time.time() - fault["t"]


def report(fault: dict, start: float) -> None:
    print(
        f"{fault['t'] - start:6.0f}  {fault['kind']:>8}  {fault['node'].name:>14}  "
        f"{fault['mode']:>16}  {when(fault['detected']):>8}  {when(fault['running']):>8}  "
        f"{when(fault['first_step']):>8}",
        flush=True,
    )


def summary(job: Job, faults: list[dict], start: float, wall: float) -> None:
    # Each step once, at the step time of its last run: a step trained again after a
    # requeue counts once, and the time of its lost first run is not productive.
    kept: dict[int, float] = {}
    for step, values in (
        JobMetric.objects.filter(job=job, time__gte=datetime.fromtimestamp(start, tz=UTC))
        .order_by("time")
        .values_list("step", "values")
    ):
        step_time = (values or {}).get("step_time_s")
        if isinstance(step_time, (int, float)):
            kept[step] = float(step_time)
    productive = sum(kept.values())
    print()
    for label, key in (
        ("detected", "detected"),
        ("running again", "running"),
        ("first new step", "first_step"),
    ):
        values = [f[key] for f in faults if f[key] is not None]
        if values:
            print(
                f"fault -> {label}: median {statistics.median(values):.1f} s, "
                f"max {max(values):.1f} s over {len(values)} of {len(faults)} fault(s)"
            )
    print(
        f"goodput: {100 * productive / wall:.1f}% ({productive:.0f} s of productive step "
        f"time over {wall:.0f} s wall, {len(kept)} steps kept, {len(faults)} fault(s))"
    )
    jobs_sync(cluster=job.cluster)
    held = goodput(CLUSTER_ID)
    if held["goodput"] is not None:
        print(
            f"goodput of held GPU time (health.selectors.goodput): "
            f"{100 * held['goodput']:.1f}% over {held['interruptions']} interruption(s)"
        )


if __name__ == "__main__":
    main()
