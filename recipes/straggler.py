"""Straggler detection: a recipe job's ranks write their per-step compute time
(node/train/steptimes.py); the poller compares them every round, and a node whose rank
computes far longer than the job's median is a straggler. Its node gets a SLOW_NODE
failure (and with it the mode's repair ladder), and the job is requeued without it.

Windows of WINDOW_STEPS steps, K = WINDOWS of them in a row, ratio >= RATIO (of the
ranks' median, so with 2 ranks the slow one must compute 1.67x the other). On this
project's emulated nodes (2 shared cores, a tiny model) one step's compute is ~0.1 s and
a neighbour's burst stretches it now and then: single steps of an unthrottled 2-rank run
reach 1.8x, 4-step windows reach 1.33x about one window in ten, but never two windows in
a row in our baseline runs; a node throttled to a quarter of its time shows 1.4-1.7x in
every window. 3 windows of 4 steps: ~10 s of steps at this scale, inside the 20 s the
recovery goal allows, and on GPUs with second-long steps still a small share of a run.
"""

from __future__ import annotations

import json
import logging
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from django.db.models import F
from django.utils import timezone

from clusters.models import Node
from clusters.providers import get_provider
from health.choices import FailureState
from health.models import NodeFailure
from health.services import failures_update
from identity.selectors import account_for
from jobs.choices import JobState
from jobs.models import Job, JobEvent
from mtc import userfs
from node.train.config import STOP_NOW_FILE
from slurm import SlurmError

log = logging.getLogger(__name__)
WINDOW_STEPS = 4
WINDOWS = 3  # K: consecutive windows over the ratio
RATIO = 1.25  # a rank's compute over the job's median compute, per window
TAIL_BYTES = 64 * 1024  # of each rank's file per round: far more than K windows
MODE = "SLOW_NODE"
RANK_FILE_RE = re.compile(r"rank-([0-9]{1,6})\.jsonl")
EXCLUDE_WAIT_S = 15.0  # for slurmctld to take the exclusion once the requeue is through
LEAVE_WAIT_S = 60.0  # for the job's part on the straggler to end (see _wait_off_node)


@dataclass(frozen=True)
class Straggler:
    rank: int
    node: str
    ratio: float  # the lowest of its K windows' ratios
    first_step: int
    last_step: int

    def evidence(self) -> str:
        return (
            f"rank {self.rank} on {self.node}: compute {self.ratio:.2f}x the job's median "
            f"in each of {WINDOWS} windows of {WINDOW_STEPS} steps "
            f"(steps {self.first_step}-{self.last_step})"
        )


def straggler_find(
    rows: list[dict], *, window: int = WINDOW_STEPS, windows: int = WINDOWS, ratio: float = RATIO
) -> Straggler | None:
    """The rank whose compute time is >= ``ratio`` x the ranks' median in each of the
    last ``windows`` complete windows (steps every rank reported, ``window`` at a time,
    consecutive), or None. ``rows``: step-time lines of every rank of one run attempt."""
    by_rank: dict[int, dict[int, dict]] = {}
    for row in rows:
        by_rank.setdefault(row["rank"], {})[row["step"]] = row
    if len(by_rank) < 2:
        return None
    common = set.intersection(*(set(steps) for steps in by_rank.values()))
    complete = sorted(
        index
        for index in {(s - 1) // window for s in common}
        if all(index * window + k + 1 in common for k in range(window))
    )
    last = complete[-windows:]
    if len(last) < windows or last[-1] - last[0] != windows - 1:
        return None
    ratios: dict[int, list[float]] = {rank: [] for rank in by_rank}
    for index in last:
        steps = range(index * window + 1, (index + 1) * window + 1)
        sums = {rank: sum(by_rank[rank][s]["compute_s"] for s in steps) for rank in by_rank}
        median = statistics.median(sums.values())
        for rank, total in sums.items():
            ratios[rank].append(total / median if median > 0 else 1.0)
    slow = {rank: min(r) for rank, r in ratios.items() if min(r) >= ratio}
    if not slow:
        return None
    rank = max(slow, key=slow.get)
    last_step = (last[-1] + 1) * window
    return Straggler(
        rank=rank,
        node=str(by_rank[rank][last_step].get("node", "")),
        ratio=round(slow[rank], 2),
        first_step=last[0] * window + 1,
        last_step=last_step,
    )


def _tail_lines(path: Path) -> list[dict]:
    """Whole lines of the last TAIL_BYTES of a rank's file (the run writes it: a line
    that is not what the runtime writes is skipped)."""
    chunk, size = userfs.read_tail(path, limit=TAIL_BYTES)
    lines = chunk.split(b"\n")
    lines = lines[1:-1] if size > TAIL_BYTES else lines[:-1]  # partial first, unfinished last
    rows = []
    for raw in lines:
        try:
            row = json.loads(raw)
        except ValueError:
            continue
        if (
            isinstance(row, dict)
            and type(row.get("step")) is int
            and type(row.get("rank")) is int
            and isinstance(row.get("compute_s"), (int, float))
            and isinstance(row.get("node"), str)
            and isinstance(row.get("time"), (int, float))
        ):
            rows.append(row)
    return rows


def job_step_times(job: Job) -> list[dict]:
    """The current run attempt's step-time lines of every rank (lines older than the
    job's start are a previous attempt's, on other nodes maybe)."""
    if not job.checkpoint_dir:
        return []
    directory = Path(job.checkpoint_dir).parent / "steptimes"
    try:
        names = userfs.list_dir(directory)
    except OSError:  # none yet, or not a folder of the run's owner
        return []
    since = job.start_time.timestamp() if job.start_time else 0.0
    rows: list[dict] = []
    for name in sorted(names):
        match = RANK_FILE_RE.fullmatch(name)
        if not match:
            continue
        path = directory / name
        try:
            found = _tail_lines(path)
        except OSError:
            continue
        rank = int(match.group(1))
        rows.extend(r for r in found if r["rank"] == rank and r["time"] >= since)
    return rows


def _stop_without_checkpoint(job: Job) -> None:
    """Ask the job's ranks to end at the requeue's SIGTERM without saving (the runtime's
    STOP_NOW_FILE): the straggler would save at its slow pace while the job cannot
    start elsewhere; it resumes from its last periodic checkpoint instead."""
    account = account_for(user=job.owner) if job.owner is not None else None
    mine = account if account is not None and account.isolated else None
    try:
        # A new file the run's owner owns, renamed over whatever had the name (a link
        # the owner left there is replaced, never written through).
        userfs.write(Path(job.checkpoint_dir).parent / STOP_NOW_FILE, "straggler\n", account=mine)
    except OSError as exc:  # the requeue still goes; the ranks then save first
        log.warning("job %s: could not ask for a stop without checkpoint: %s", job, exc)


def _exclude(client, job_id: str, node: str) -> bool:
    """Add ``node`` to the requeued job's ExcNodeList (slurmctld takes it once the job is
    pending again), and let the job start at once."""
    deadline = time.monotonic() + EXCLUDE_WAIT_S
    while True:
        shown = client.run(["scontrol", "show", "job", "--oneliner", job_id], check=False).stdout
        match = re.search(r"\bExcNodeList=(\S+)", shown)
        current = [] if not match or match.group(1) == "(null)" else match.group(1).split(",")
        wanted = ",".join(sorted({*current, node}))
        proc = client.run(
            ["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={wanted}", "StartTime=now"],
            check=False,
        )
        if proc.returncode == 0:
            return True
        if time.monotonic() > deadline:
            log.warning("job %s: could not exclude %s: %s", job_id, node, proc.stderr.strip())
            return False
        time.sleep(0.2)


def _wait_off_node(client, job_id: str, node: str) -> None:
    """Until the job's part on the node has ended (its ranks save a checkpoint on the
    requeue's SIGTERM, slowly on a slow node): the repair that follows drains and reboots
    the node, and a reboot under a job still completing there leaves it stuck COMPLETING."""
    deadline = time.monotonic() + LEAVE_WAIT_S
    while time.monotonic() < deadline:
        try:
            if job_id not in client.node_jobs(node):
                return
        except SlurmError as exc:  # unknown: as if it were still there
            log.info("job %s on %s: %s", job_id, node, exc)
        time.sleep(0.3)


def job_straggler_act(job: Job, straggler: Straggler) -> bool:
    """Requeue the job without the straggler's node and open SLOW_NODE on the node (its
    repair ladder follows). Once: the job's requeue count is the compare-and-swap, and a
    node with SLOW_NODE unresolved is not acted on again."""
    node = Node.objects.filter(cluster_id=job.cluster_id, name=straggler.node).first()
    if node is None:
        log.warning("job %s: straggler on unknown node %r", job, straggler.node)
        return False
    unresolved = NodeFailure.objects.filter(node=node, mode=MODE).exclude(
        state=FailureState.RESOLVED
    )
    if unresolved.exists():
        return False
    taken = Job.objects.filter(
        pk=job.pk, state=JobState.RUNNING, requeue_count=job.requeue_count
    ).update(requeue_count=F("requeue_count") + 1)
    if not taken:
        return False
    cluster = job.cluster
    client = get_provider(cluster.provider).slurm(cluster)
    evidence = f"straggler: {straggler.evidence()}"
    _stop_without_checkpoint(job)
    try:
        client.control("requeue", job.job_id)
    except SlurmError as exc:
        log.warning("job %s: requeue for the straggler failed: %s", job, exc)
        Job.objects.filter(pk=job.pk).update(requeue_count=F("requeue_count") - 1)
        return False
    excluded = _exclude(client, job.job_id, node.name)
    JobEvent.objects.create(
        job=job,
        time=timezone.now(),
        state=JobState.REQUEUED,
        # "interrupted:" as every requeue by a repair: goodput counts the restart.
        cause=(
            f"interrupted: {evidence}; requeued "
            + (f"without {node.name}" if excluded else f"(could not exclude {node.name})")
        )[:500],
    )
    log.warning("job %s: %s; requeued without %s", job, evidence, node.name)
    _wait_off_node(client, job.job_id, node.name)
    failures_update(
        node=node,
        source="controller",
        findings=[
            {
                "code": MODE,
                "severity": "critical",
                "message": f"{evidence} (job {job.job_id})",
                "check": "steptimes",
                "gpu": None,
            }
        ],
    )
    return True


def recipe_stragglers_check(cluster) -> int:
    """The poller's round: every running recipe job of the cluster; returns how many were
    requeued without a straggler."""
    acted = 0
    jobs = (
        Job.objects.filter(cluster=cluster, state=JobState.RUNNING, nodes__gt=1)
        .exclude(recipe="")
        .exclude(checkpoint_dir="")
        .select_related("cluster")
        .order_by()  # the (cluster, state) index, not a walk of the history (jobs.sync._rows)
    )
    for job in jobs:
        try:
            straggler = straggler_find(job_step_times(job))
            if straggler is not None and job_straggler_act(job, straggler):
                acted += 1
        except Exception:  # noqa: BLE001 - one bad run must not stop the others
            log.exception("job %s: straggler check failed", job)
    return acted
