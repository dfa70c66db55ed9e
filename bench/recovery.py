"""Recovery from real faults under a running 2-node llama-pretrain job.

For each fault kind (kill, disk, slow, straggle, hang on the local provider), inject it
on one of the job's nodes and print the timeline: fault -> detected -> repair started (drain) ->
job requeued -> job running again -> first new training step, and the steps lost.
Over several runs, the medians. `straggle` throttles only the job's processes on the
node: the ranks' step times find it (recipes/straggler.py), and "running again" is the
job running without that node.

``kill-with-spare`` is ``kill`` on a pool of 3 nodes with one hot spare
(``spare_node_count: 1``): the 2-node job fills the pool but for the spare, so it can
only run again at full size because the spare stands in; the spare column names it.

    .venv/bin/python bench/recovery.py [--runs 3] \
        [--kinds kill,disk,slow,straggle,hang,kill-with-spare] [--hang-floor S]

`hang` stops one rank (SIGSTOP); the job is hung once it made no progress for
max(5 x median step time, MTC_HANG_FLOOR_S): "detected" is when mtc found it (then
its stacks are taken, the job requeued without that node, the node marked JOB_HANG).
A round that sees a job's threshold coming sends a check timed to it (on the polls
queue; here a thread, bench/operations_worker.py), so with the default floor of 60 s
it measures the floor from the run's last progress (a little before the stop) plus
the check's own latency; `--hang-floor` sets a lower floor for this run.

The control plane's loops run in this process at their production cadence: the
poller every 2 s (jobs, metrics, controller-side health), the node agents every 2 s
(their checks, run on demand here so the figures do not wait on a timer), and the
operations (repairs, with their reboot and fabric check) on a thread of their own, as
the operations queue's worker runs them beside the poller (bench/operations_worker.py).
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
TMP = tempfile.mkdtemp(prefix="mtc-bench-recovery-")
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
from clusters.spares import SPARE_REASON  # noqa: E402
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
WORKER: operations_worker.OperationsWorker | None = None
# How each kind's requeue is recorded on the job (its JobEvent's cause).
REQUEUE_CAUSE = {"straggle": "interrupted: straggler", "hang": "interrupted: hung"}


def tick(cluster, *, agents_on: list[str]) -> None:
    """One round of the control plane: the poller, and the named nodes' agents."""
    provider = get_provider("local")
    jobs_sync(cluster=cluster)
    recipe_round(cluster)  # metrics, then stragglers and hangs
    jobs_release_requeued(cluster=cluster)
    for name in agents_on:
        node = Node.objects.get(cluster=cluster, name=name)
        report = provider.node_checks(cluster, node)
        if report:
            report_ingest(node=node, report=report)
    cluster_health_poll(cluster)


class RunningWatch(threading.Thread):
    """Slurm's own view, polled beside the control plane's loop: when the requeued job is
    RUNNING again, and on how many nodes, at squeue's 0.1 s grain rather than the loop's.
    Only squeue: no database from this thread."""

    def __init__(self, cluster, job_id: str):
        super().__init__(daemon=True)
        self.client = get_provider("local").slurm(cluster)
        self.job_id = job_id
        info = self.client.job(job_id)
        self.restarts = info.restart_count if info else 0
        self.when: float | None = None
        self.nodes: int | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            info = self.client.job(self.job_id)
            if info and info.state == "RUNNING" and info.restart_count > self.restarts:
                self.when, self.nodes = time.time(), info.nodes
                return
            self.done.wait(0.1)


def job_hosts(cluster, node_list: str) -> list[str]:
    client = get_provider("local").slurm(cluster)
    return client.run(["scontrol", "show", "hostnames", node_list]).stdout.split()


def one_run(cluster, owner, kind: str) -> dict:
    fault = "kill" if kind == "kill-with-spare" else kind
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
    names = job_hosts(cluster, job.node_list)
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
    watch = RunningWatch(cluster, job.job_id)
    watch.start()
    fault_time = time.time()
    since = datetime.fromtimestamp(fault_time, tz=UTC)
    fault_inject(node=victim, kind=fault)
    running_again, hosts_again = None, []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        tick(cluster, agents_on=agents)
        current = Job.objects.get(pk=job.pk)
        repair = Repair.objects.filter(node=victim, create_time__gte=since).first()
        if kind == "straggle":
            moved = (
                current.state == "RUNNING"
                and JobEvent.objects.filter(job=job, cause__startswith=REQUEUE_CAUSE[kind]).exists()
                and victim.name not in job_hosts(cluster, current.node_list)
            )
        elif kind == "hang":
            hang = JobHang.objects.filter(job=job, detected_time__gte=since).first()
            moved = bool(
                hang is not None
                and hang.state == JobHang.REQUEUED
                and current.state == "RUNNING"
                and current.start_time
                and current.start_time > hang.detected_time
            )
        else:
            moved = bool(repair and repair.jobs_requeued and current.state == "RUNNING")
        if moved and not running_again:
            running_again = time.time()
            # Slurm starts a job on all its nodes or not at all: running is full size.
            hosts_again = job_hosts(cluster, current.node_list)
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
    watch.done.set()
    watch.join(timeout=5)
    if WORKER is not None:  # the run's repair finishes before the next run's fault
        waited = time.monotonic() + 300
        while not WORKER.idle() and time.monotonic() < waited:
            time.sleep(0.5)
    failure = (
        NodeFailure.objects.filter(node=victim, first_seen__gte=since)
        .order_by("first_seen")
        .first()
    )
    repair = (
        Repair.objects.filter(node=victim, create_time__gte=since).order_by("create_time").first()
    )
    requeued = (
        JobEvent.objects.filter(
            job=job, time__gte=since, cause__startswith=REQUEUE_CAUSE.get(kind, "interrupted")
        )
        .order_by("time")
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
        # straggle and hang: the job is requeued when found, its node's failure opens
        # once the job has left the node.
        "detected": (
            hang.detected_time.timestamp() - fault_time
            if hang is not None
            else requeued.time.timestamp() - fault_time
            if kind == "straggle" and requeued
            else (failure.first_seen.timestamp() - fault_time if failure else None)
        ),
        # hang: the run's last progress (a step or a checkpoint line), which its threshold
        # counts from; before the fault, or after it when the peers finished a step.
        "last_progress": hang.since.timestamp() - fault_time if hang is not None else None,
        "drained": repair.start_time.timestamp() - fault_time if repair else None,
        "requeued": requeued.time.timestamp() - fault_time if requeued else None,
        # Slurm's moment where it was seen, else the loop's.
        "running": (watch.when or running_again) - fault_time if running_again else None,
        "first_step": first_step.time.timestamp() - fault_time if first_step else None,
        # Steps done before the fault that the resumed run trains again.
        "steps_lost": max(0, step_at_fault - resumed_from) if resumed_from is not None else None,
        "resumed_from": resumed_from,
        "spare": repair.spare_node.name if repair and repair.spare_node_id else "-",
        "nodes_again": watch.nodes or (len(hosts_again) if running_again else None),
        "victim_back_as": _back_as(cluster, victim) if kind == "kill-with-spare" else "-",
    }
    try:
        job_control(job=Job.objects.get(pk=job.pk), action="cancel", actor="bench")
    except Exception:  # noqa: BLE001 - already ended
        pass
    fault_clear(node=victim)
    return row


def _back_as(cluster, victim: Node) -> str:
    """What the repaired node came back as: the pool's spare, in service, or still out."""
    node = Node.objects.get(pk=victim.pk)
    info = {n.name: n for n in get_provider("local").slurm(cluster).nodes()}.get(node.name)
    if node.spare and info is not None and info.reason == SPARE_REASON:
        return "spare"
    return "service" if info is not None and "DRAIN" not in info.flags else "out"


def fmt(value) -> str:
    return "-" if value is None else (f"{value:6.2f}" if isinstance(value, float) else str(value))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kinds", default="kill,disk,slow,straggle,hang")
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
    kinds = args.kinds.split(",")
    clusters = {}
    if any(k != "kill-with-spare" for k in kinds):
        cluster_services.cluster_create(spec=dict(DEMO_SPEC, cluster_id="recovery"), owner=owner)
        clusters["plain"] = Cluster.objects.get(cluster_id="recovery")
    if "kill-with-spare" in kinds:
        # A pool of 3 with one spare: the 2-node job leaves no free node but the spare. A
        # short id: slurmstepd's socket path (data dir, id, node name) must fit 108 bytes.
        spec = copy.deepcopy(dict(DEMO_SPEC, cluster_id="spares"))
        spec["node_pools"][1]["scaling_spec"] = {"min_node_count": 3, "max_node_count": 3}
        spec["node_pools"][1]["spare_node_count"] = 1
        cluster_services.cluster_create(spec=spec, owner=owner)
        clusters["spare"] = Cluster.objects.get(cluster_id="spares")
    global WORKER
    WORKER = operations_worker.start()
    operations_worker.start(
        operations_worker.POLL_TASKS, "polls-worker"
    )  # hang checks timed to a threshold
    columns = (
        "kind",
        "node",
        "mode",
        "action",
        "detected",
        "last_progress",
        "drained",
        "requeued",
        "running",
        "first_step",
        "steps_lost",
        "resumed_from",
        "spare",
        "nodes_again",
        "victim_back_as",
    )
    print(
        "seconds after the fault; steps lost: steps done before the fault that the job "
        "trains again (checkpoint interval 10)"
    )
    print("  ".join(f"{c:>12}" for c in columns))
    rows = []
    try:
        for kind in kinds:
            cluster = clusters["spare" if kind == "kill-with-spare" else "plain"]
            for _ in range(args.runs):
                row = one_run(cluster, owner, kind)
                rows.append(row)
                print("  ".join(f"{fmt(row[c]):>12}" for c in columns), flush=True)
        print()
        for kind in kinds:
            mine = [r for r in rows if r["kind"] == kind and r["running"] is not None]
            if mine:
                print(
                    f"{kind}: median fault -> detected "
                    f"{statistics.median(r['detected'] for r in mine):.2f} s "
                    f"(max {max(r['detected'] for r in mine):.2f}), -> running again "
                    f"{statistics.median(r['running'] for r in mine):.1f} s "
                    f"(max {max(r['running'] for r in mine):.1f}), "
                    f"-> first new step {statistics.median(r['first_step'] for r in mine):.1f} s,"
                    f" most steps lost {max(r['steps_lost'] or 0 for r in mine)} "
                    f"over {len(mine)} run(s)"
                )
        for cluster in clusters.values():
            jobs_sync(cluster=cluster)  # the cancelled jobs' last states, for their GPU time
            good = goodput(cluster.cluster_id)
            if good["goodput"] is None:
                continue
            print(
                f"goodput on {cluster.cluster_id} (health.selectors.goodput): "
                f"{100 * good['goodput']:.1f}%"
                f" of {good['held_gpu_s']:.0f} GPU-s held by {good['jobs']} job(s); lost "
                f"{good['restart_gpu_s']:.0f} restarting + {good['redo_gpu_s']:.0f} redoing "
                f"steps over {good['interruptions']} interruption(s)"
            )
    finally:
        for cluster in clusters.values():
            get_provider("local").delete_cluster(cluster)
        shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    main()
