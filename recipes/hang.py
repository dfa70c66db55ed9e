"""Hang detection for recipe jobs (called from the poller's recipe round).

A RUNNING recipe job whose run made no progress (no step, no line in metrics.jsonl) for
max(HANG_FACTOR x its median step time, MTC_HANG_FLOOR_S) is hung: one rank stopped and
the others wait in a collective, which never times out on its own (gloo's and NCCL's
timeouts are tens of minutes). Then mtc

1. asks every rank for its stacks (a request file each rank's watcher thread answers by
   signalling its own faulthandler, node/train/stacks.py), which it appends to
   ``<run>/stacks/rank-R.txt``; a stopped rank writes nothing;
2. names the rank that is not inside the collective: the one rank with no fresh dump, else
   the one rank whose training thread is outside torch.distributed and backward;
3. copies the stacks into the job's stderr file (what the job page's output shows);
4. requeues the job and keeps it off that node (ExcNodeList, set while it is pending);
5. once the job has left that node, marks it with a JOB_HANG failure (health.policy:
   reboot, then replace), the rank and its stack excerpt in the message.

A JobHang row per (job, attempt, step) is the compare-and-swap: two pollers that find
the same hang insert it once, and only the one that inserted it acts.

Hangs before a run's first step (its setup) are not judged: setup time has no median.

(Past 400 lines: finding, explaining and recovering from a hang are one sequence that
reads top to bottom, and its parts share the stacks' format.)
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from clusters.models import Node
from clusters.providers import get_provider
from health.services import failures_update
from identity.selectors import account_for
from jobs.choices import JobState
from jobs.models import Job, JobEvent, JobHang, JobMetric
from jobs.selectors import job_output_path
from mtc import userfs
from node.train.config import SAVING_EVENT
from node.train.stacks import stacks_path, stacks_request_path
from slurm import SlurmError

from .memory import signal_lead

log = logging.getLogger(__name__)
HANG_FACTOR = 5
MEDIAN_OF_STEPS = 50  # the step times the median is taken over: the latest ones
STACKS_WAIT_S = 3.0  # how long the ranks have to write their stacks after the signal
STACKS_KEEP = 64 * 1024  # characters of stacks kept per hang (every rank's)
MARK_AFTER_S = 120.0  # a node whose hung job has not left it by then is marked all the same
RUN_CONFIG_MAX = 2**20  # run.json: mtc wrote it, the run's owner may have changed it
COLLECTIVE_FUNCS = frozenset(
    {
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "broadcast_object_list",
        "barrier",
        "backward",
        "wait",
        "full_tensor",
    }
)
FRAME_RE = re.compile(r'\s*File "(?P<file>[^"]*)", line \d+ in (?P<func>\S+)')
HEADER_RE = re.compile(r"# mtc stacks: rank (?P<rank>\d+) node (?P<node>\S*) pid \d+")


def hang_threshold_s(step_times: list[float], floor_s: float) -> float:
    """max(HANG_FACTOR x the median step time, floor_s)."""
    times = [t for t in step_times if isinstance(t, (int, float)) and t >= 0]
    median = statistics.median(times) if times else 0.0
    return max(HANG_FACTOR * median, floor_s)


@dataclass
class RankStacks:
    rank: int
    node: str
    fresh: bool  # wrote a dump after the signal
    text: str  # that dump ("" when none)


def training_thread(dump: str) -> str:
    """The block of a faulthandler dump that runs the training loop (the thread whose
    stack holds node/train/train.py); the whole dump when none does."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump)
    for block in blocks:
        if "node/train/train.py" in block:
            return block.strip()
    return dump.strip()


def in_collective(dump: str) -> bool:
    """Whether the training thread waits in a collective: a frame in torch.distributed,
    or a collective (or backward, where FSDP reduces) by name."""
    for line in training_thread(dump).splitlines():
        frame = FRAME_RE.match(line)
        if frame and ("torch/distributed/" in frame["file"] or frame["func"] in COLLECTIVE_FUNCS):
            return True
    return False


def hung_rank(ranks: list[RankStacks]) -> tuple[int | None, str]:
    """(the rank that is not inside the collective, why), or (None, why) when the stacks
    do not single one out."""
    if len(ranks) < 2:
        return None, "a single rank: no collective to wait in"
    silent = [r for r in ranks if not r.fresh]
    if len(silent) == 1:
        return silent[0].rank, "wrote no stacks: stopped (or stuck outside Python)"
    if silent:
        names = ", ".join(str(r.rank) for r in silent)
        return None, f"ranks {names} wrote no stacks"
    outside = [r for r in ranks if not in_collective(r.text)]
    if len(outside) == 1:
        return outside[0].rank, "the only rank not inside a collective"
    if not outside:
        return None, "every rank waits in a collective"
    return None, f"{len(outside)} ranks are outside a collective"


def _last_progress(job: Job, run_dir: Path) -> tuple[JobMetric | None, datetime | None]:
    """The latest step stored, and the later of its time and metrics.jsonl's mtime (a
    checkpoint event is progress too, and the file may be ahead of the poller)."""
    last = JobMetric.objects.filter(job=job).order_by("-time", "-id").first()
    if last is None or last.time is None:
        return None, None
    try:
        mtime = datetime.fromtimestamp(userfs.lookup(run_dir / "metrics.jsonl").st_mtime, tz=UTC)
    except OSError:
        mtime = last.time
    return last, max(last.time, mtime)


def hang_due(
    job: Job, *, now: datetime | None = None, within_s: float = 0.0
) -> tuple[JobMetric, datetime, float] | None:
    """(last step, last progress, threshold) when the job is hung now, or will be within
    ``within_s`` unless it progresses first (at ``since + threshold``); else None."""
    if job.state != JobState.RUNNING or not job.recipe or not job.checkpoint_dir:
        return None
    now = now or timezone.now()
    last, since = _last_progress(job, Path(job.checkpoint_dir).parent)
    if last is None or since is None or job.start_time is None or last.time < job.start_time:
        return None  # no step in this attempt yet: setup is not judged
    handled = job.hangs.order_by("-detected_time").values_list("detected_time", flat=True)
    latest = handled.first()
    if latest is not None and since <= latest:
        return None  # requeued after its last hang, and in its setup again
    times = list(
        JobMetric.objects.filter(job=job)
        .order_by("-id")
        .values_list("values__step_time_s", flat=True)[:MEDIAN_OF_STEPS]
    )
    threshold = hang_threshold_s(times, settings.MTC_HANG_FLOOR_S)
    idle = (now - since).total_seconds() + within_s
    if idle < threshold:
        return None
    run_dir = Path(job.checkpoint_dir).parent
    if saving_announced(run_dir / "metrics.jsonl"):
        # A synchronous save (the last or a stop's) writes no line until it is done: it
        # gets the time Slurm's stop signal gives a save (recipes/memory.py).
        threshold = max(threshold, float(_save_allowance_s(job, run_dir)))
        if idle < threshold:
            return None
    return last, since, threshold


def saving_announced(metrics_file: Path) -> bool:
    """Whether the run's last line says a synchronous checkpoint save has begun."""
    try:
        tail = userfs.read_tail(metrics_file, limit=4096)[0].splitlines()
    except OSError:
        return False
    try:
        return bool(tail) and json.loads(tail[-1]).get("event") == SAVING_EVENT
    except (ValueError, AttributeError):
        return False


def _save_allowance_s(job: Job, run_dir: Path) -> int:
    try:
        config = json.loads(userfs.read_bytes(run_dir / "run.json", limit=RUN_CONFIG_MAX))
    except (OSError, ValueError):
        config = {}
    if not isinstance(config, dict):
        config = {}
    return signal_lead(
        family=str(config.get("family") or "llama"),
        model=str(config.get("model") or ""),
        nodes=job.nodes,
    )


def _sizes(paths: list[Path]) -> list[int]:
    out = []
    for path in paths:
        try:
            out.append(userfs.lookup(path).st_size)
        except OSError:
            out.append(-1)
    return out


def _stacks_ask(job: Job, run_dir: Path) -> None:
    """Write the run's stacks request anew (node/train/stacks.py): each rank's watcher
    signals its own process. A file, not a signal from Slurm: under proctrack/cgroup
    Slurm signals only a step's tasks (torchrun), never its ranks."""
    account = account_for(user=job.owner) if job.owner_id else None
    mine = account if account is not None and account.isolated else None
    userfs.write(stacks_request_path(run_dir), secrets.token_hex(8) + "\n", account=mine)


def stacks_collect(job: Job, world: int) -> list[RankStacks]:
    """Ask the job's ranks for their stacks and read each rank's fresh dump."""
    run_dir = Path(job.checkpoint_dir).parent
    paths = [stacks_path(run_dir, rank) for rank in range(world)]
    before = _sizes(paths)
    try:
        _stacks_ask(job, run_dir)
    except OSError as exc:  # no rank set up its stacks (or the folder is not theirs)
        log.warning("job %s: could not ask for stacks: %s", job, exc)
        return [RankStacks(rank=r, node="", fresh=False, text="") for r in range(world)]
    deadline = time.monotonic() + STACKS_WAIT_S
    while time.monotonic() < deadline:
        # A dump is written in one go by the signal handler; stop once every rank grew.
        if all(a > b for a, b in zip(_sizes(paths), before, strict=True)):
            break
        time.sleep(0.1)
    time.sleep(0.2)  # let a dump that just began finish
    ranks = []
    for rank, (path, size) in enumerate(zip(paths, before, strict=True)):
        node, text = "", ""
        try:
            # The rank writes this file as the job's owner: read without following a
            # link, a regular file of theirs (a FIFO or another file is skipped).
            with userfs.open_read(path) as fh:
                first = fh.readline(4096).decode("utf-8", errors="replace")
                header = HEADER_RE.match(first)
                node = header["node"] if header and int(header["rank"]) == rank else ""
                fh.seek(max(size, 0))
                text = fh.read(STACKS_KEEP).decode("utf-8", errors="replace")
        except OSError:
            pass
        ranks.append(RankStacks(rank=rank, node=node, fresh=bool(text.strip()), text=text))
    return ranks


def _rank_node(job: Job, client, rank: int, world: int, named: str) -> str:
    """The node the rank ran on: its stacks file's header, else its place in the job's
    node list (torchrun numbers ranks node by node)."""
    if named:
        return named
    hosts = client.run(["scontrol", "show", "hostnames", job.node_list], check=False).stdout
    names = hosts.split()
    per_node = max(world // max(len(names), 1), 1)
    index = rank // per_node
    return names[index] if index < len(names) else ""


def _stacks_text(ranks: list[RankStacks]) -> str:
    parts = []
    for r in ranks:
        where = f" on {r.node}" if r.node else ""
        body = r.text.strip() if r.fresh else "(no stacks: the rank did not answer)"
        parts.append(f"--- rank {r.rank}{where}\n{body}")
    return "\n".join(parts)[:STACKS_KEEP]


def _output_append(job: Job, text: str) -> None:
    """Into the job's stderr file, where its page's output shows it (best effort)."""
    path = job_output_path(job, "stderr")
    if path is None:
        return
    try:
        userfs.append(path, text.encode("utf-8"))
    except OSError as exc:
        log.warning("job %s: could not add the hang's stacks to %s: %s", job, path, exc)


def _excluded(job: Job, node: str) -> list[str]:
    """Every node a hang of this job named, this one included: the job's ExcNodeList."""
    nodes = set(job.hangs.exclude(node="").values_list("node", flat=True)) | {node}
    return sorted(n for n in nodes if n)


def _requeue(job: Job, client, exclude: list[str]) -> str:
    """Requeue, then keep it off ``exclude`` (Slurm takes ExcNodeList only on a pending
    job; a requeued one is pending, completing or not, and cannot start before its update).
    Returns "" or why it failed."""
    try:
        client.run(["scontrol", "requeue", job.job_id])
    except SlurmError as exc:
        info = client.job(job.job_id)
        if info is None or info.state != "PENDING":  # else requeued already (a repair)
            return f"requeue refused: {exc}"
    why = ""
    if exclude:
        try:
            client.job_exclude(job.job_id, exclude)
        except SlurmError as exc:
            why = f"requeued, but could not exclude {','.join(exclude)}: {exc}"
    return why  # the job poller starts it (jobs_release_requeued)


def hang_handle(
    job: Job, *, due: tuple[JobMetric, datetime, float] | None = None
) -> JobHang | None:
    """Detect, explain and recover one job's hang (``due``: hang_due's answer, when the
    caller has it); None when it is not hung (or another poller handles this very hang)."""
    due = due or hang_due(job)
    if due is None:
        return None
    last, since, threshold = due
    now = timezone.now()
    try:
        with transaction.atomic():
            hang = JobHang.objects.create(
                job=job,
                attempt=job.requeue_count,
                step=last.step,
                since=since,
                detected_time=now,
                threshold_s=threshold,
            )
    except IntegrityError:
        return None  # found by another round first: that one acts
    client = get_provider(job.cluster.provider).slurm(job.cluster)
    world = int(job.metrics.get("world_size") or job.nodes)
    ranks = stacks_collect(job, world)
    rank, why = hung_rank(ranks) if ranks else (None, "the job's ranks could not be asked")
    node = _rank_node(job, client, rank, world, ranks[rank].node) if rank is not None else ""
    idle = (now - since).total_seconds()
    head = (
        f"mtc: job {job.job_id} hung: no progress for {idle:.0f} s after step {last.step} "
        f"(threshold {threshold:.0f} s); "
        + (f"rank {rank} on {node}: {why}" if rank is not None else why)
    )
    stacks = _stacks_text(ranks)
    excerpt = ""
    if rank is not None:
        excerpt = training_thread(ranks[rank].text) if ranks[rank].fresh else why
    _output_append(job, f"\n{head}\n{stacks}\n")
    JobHang.objects.filter(pk=hang.pk).update(
        rank=rank, node=node, why=why[:300], stacks=stacks, excerpt=excerpt[:4000]
    )
    failed = _requeue(job, client, _excluded(job, node))
    requeued = not failed.startswith("requeue refused")
    JobHang.objects.filter(pk=hang.pk, state=JobHang.DETECTED).update(
        state=JobHang.REQUEUED if requeued else JobHang.NOT_REQUEUED
    )
    # "interrupted:" as a repair's requeue says it: goodput counts the restart as lost.
    cause = f"interrupted: hung after step {last.step} ({idle:.0f} s without progress)" + (
        f"; rank {rank} on {node}; requeued without {node}" if node else "; requeued"
    )
    JobEvent.objects.create(
        job=job,
        time=timezone.now(),
        state=JobState.REQUEUED if requeued else job.state,
        cause=(cause + (f"; {failed}" if failed else ""))[:300],
    )
    if requeued:
        Job.objects.filter(pk=job.pk, requeue_count=job.requeue_count).update(
            requeue_count=job.requeue_count + 1
        )
    log.warning("%s", head)
    hang.refresh_from_db()
    return hang


def hang_check_timed(job: Job, *, early_s: float) -> JobHang | None:
    """A check sent for the moment the job's threshold comes (recipes.tasks): one that
    starts up to ``early_s`` before it (a timer's grain, two processes' clocks) waits for
    it rather than leave the job to the next round; a step meanwhile means no hang."""
    due = hang_due(job, within_s=early_s)
    if due is None:
        return None
    _, since, threshold = due
    early = (since + timedelta(seconds=threshold) - timezone.now()).total_seconds()
    if early > 0:
        time.sleep(early)
        due = hang_due(job)
    return hang_handle(job, due=due) if due is not None else None


def _node_mark(hang: JobHang) -> None:
    node = Node.objects.filter(cluster_id=hang.job.cluster_id, name=hang.node).first()
    if node is None:
        return
    failures_update(
        node=node,
        source="controller",
        findings=[
            {
                "code": "JOB_HANG",
                "severity": "critical",
                "message": (
                    f"job {hang.job.job_id} rank {hang.rank} hung ({hang.why}) after step "
                    f"{hang.step}; stack: {hang.excerpt[-300:] or '-'}"
                )[:500],
                "check": "hang",
                "gpu": None,
            }
        ],
    )


def hang_nodes_mark(cluster) -> int:
    """Open JOB_HANG on the nodes hangs named, once their job has left the node (or after
    MARK_AFTER_S): its repair drains and reboots the node, and a reboot while the job's
    requeue still completes there would leave that job COMPLETING on it. A hang that
    could not be requeued marks its node at once (the repair then requeues the job)."""
    marked = 0
    # The few unmarked hangs of every cluster, this one's picked here: asked with the
    # cluster's jobs joined, SQLite walked the cluster's whole job history for them.
    hangs = JobHang.objects.filter(
        node_marked=False,
        state__in=(JobHang.REQUEUED, JobHang.NOT_REQUEUED),
    ).exclude(node="")
    client = None
    for hang in hangs.select_related("job"):
        if hang.job.cluster_id != cluster.pk:
            continue
        waited = (timezone.now() - hang.detected_time).total_seconds()
        if hang.state == JobHang.REQUEUED and waited < MARK_AFTER_S:
            client = client or get_provider(cluster.provider).slurm(cluster)
            try:
                if hang.job.job_id in client.node_jobs(hang.node):
                    continue
            except SlurmError:
                continue
        if JobHang.objects.filter(pk=hang.pk, node_marked=False).update(node_marked=True):
            _node_mark(hang)
            marked += 1
    return marked


def recipe_hangs_check(
    cluster, *, check_at: Callable[[int, datetime], None] | None = None, lookahead_s: float = 0.0
) -> int:
    """Every RUNNING recipe job of the cluster: how many hangs were handled now. A job
    that will be hung within ``lookahead_s`` (the time to the next round) unless it
    progresses is passed to ``check_at(job pk, when)``, so that it is judged at its
    threshold to the second rather than up to a round later."""
    handled = 0
    now = timezone.now()
    recent = now - timedelta(seconds=settings.MTC_HANG_FLOOR_S - lookahead_s)
    jobs = (
        Job.objects.filter(cluster=cluster, state=JobState.RUNNING, start_time__lte=recent)
        .exclude(recipe="")
        .exclude(checkpoint_dir="")
        .select_related("cluster")
        .order_by()  # the (cluster, state) index, not a walk of the history (jobs.sync._rows)
    )
    for job in jobs:
        try:
            due = hang_due(job, now=now, within_s=lookahead_s if check_at else 0.0)
            if due is None:
                continue
            _, since, threshold = due
            when = since + timedelta(seconds=threshold)
            if when > now and check_at is not None:
                check_at(job.pk, when)
            else:
                handled += hang_handle(job, due=due) is not None
        except Exception:  # noqa: BLE001 - one job's trouble must not stop the others
            log.exception("job %s: hang check failed", job)
    hang_nodes_mark(cluster)
    return handled
