"""Reading a recipe run's metrics.jsonl into the database (by the poller), so the
pages and the API never read run files per request."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from jobs.choices import ACTIVE_STATES
from jobs.models import UNSETTLED, Job, JobEvent, JobMetric
from mtc import userfs

log = logging.getLogger(__name__)
MAX_READ = 4 * 1024 * 1024  # per poll and job; the rest waits for the next poll
SUMMARY_KEYS = ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "reward")
# From the run's start event: what it read of its data (node/train/train.py).
DATASET_KEYS = ("dataset_documents", "dataset_tokens")
# How long after its end a job's metrics file is still read: its last lines, written as
# it ended, reach a shared filesystem's readers late, and a poller that was down settles
# the job (and so stops counting it as unsettled) before this round reads them.
FINAL_WINDOW = timedelta(hours=1)


def _time(value) -> datetime | None:
    try:
        return datetime.fromtimestamp(float(value), tz=UTC)
    except (TypeError, ValueError, OverflowError):
        return None


def _holds_nul(value) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_nul(item) for item in value)
    return False


STEP_MAX = 2**31 - 1  # JobMetric.step's column


def _step(value) -> int | None:
    """A step the run wrote, or None: the run writes this file, and one line that raises
    would stop every later line of the job from being read."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, int) and 0 <= value <= STEP_MAX:
        return value
    return None


def job_metrics_ingest(job: Job) -> int:
    """Store the lines written since the last call; return how many steps were added."""
    path = job.metrics_path
    if path is None:
        return 0
    try:
        # The run writes this file as its owner: never through a link, never a FIFO,
        # only a regular file of theirs (mtc.userfs).
        chunk, _ = userfs.read_at(path, offset=job.metrics_offset, limit=MAX_READ)
    except OSError:
        return 0
    complete = chunk.rfind(b"\n") + 1  # a line still being written waits
    if not complete:
        return 0
    summary = dict(job.metrics)
    points: list[JobMetric] = []
    events: list[JobEvent] = []
    redo_from: int | None = None
    for raw in chunk[:complete].splitlines():
        try:
            # NaN/Infinity (a diverged loss) are not JSON a database takes: store null.
            entry = json.loads(raw, parse_constant=lambda _: None)
        except ValueError:
            log.warning("job %s: skipping a malformed metrics line", job)
            continue
        if not isinstance(entry, dict):
            continue
        # The run writes this file; PostgreSQL's JSON holds no NUL, and one such line
        # would fail the whole batch at every poll.
        if b"\\u0000" in raw and _holds_nul(entry):
            log.warning("job %s: skipping a metrics line with a NUL character", job)
            continue
        event = entry.get("event")
        if event:
            step = entry.get("step")
            if event == "resumed":
                redo_from = _step(entry.get("from_step", step or 0))
                if redo_from is None:
                    log.warning("job %s: skipping a resume line without a step", job)
                    continue
                points = [p for p in points if p.step <= redo_from]
                summary["resumed_from_step"] = redo_from
            checkpoint_step = _step(step) if event == "checkpoint" else None
            if checkpoint_step is not None:
                summary["last_checkpoint_step"] = checkpoint_step
            if event == "start":
                summary.pop("done", None)
                world = entry.get("world_size")  # how many ranks' stacks a hang expects
                if isinstance(world, int) and not isinstance(world, bool) and world > 0:
                    summary["world_size"] = world
                for key in DATASET_KEYS:
                    if isinstance(entry.get(key), int) and not isinstance(entry[key], bool):
                        summary[key] = entry[key]
            if event == "done":
                summary["done"] = True
            if event in ("resumed", "done"):
                events.append(
                    JobEvent(
                        job=job,
                        time=_time(entry.get("time")) or timezone.now(),
                        state=job.state,
                        cause=f"training {event}"
                        + (
                            f" from the step-{redo_from} checkpoint"
                            if event == "resumed"
                            else f" at step {step}"
                        ),
                    )
                )
            continue
        step = _step(entry.get("step"))
        if step is None:  # no step, or one no column holds: the line alone is skipped
            continue
        values = {k: v for k, v in entry.items() if k not in ("step", "time")}
        points.append(JobMetric(job=job, step=step, time=_time(entry.get("time")), values=values))
        summary["step"] = step
        if "loss" in values and "first_loss" not in summary:
            summary["first_loss"] = values["loss"]
        for key in SUMMARY_KEYS:
            if key in values:
                summary[f"last_{key}" if key == "loss" else key] = values[key]
    with transaction.atomic():
        if redo_from is not None:  # steps after the checkpoint are being trained again
            JobMetric.objects.filter(job=job, step__gt=redo_from).delete()
        JobMetric.objects.bulk_create(points)
        JobEvent.objects.bulk_create(events)
        job.metrics = summary
        job.metrics_offset += complete
        job.save(update_fields=["metrics", "metrics_offset", "update_time"])
    return len(points)


def recipe_jobs_ingest(cluster) -> int:
    """Every recipe job of the cluster whose metrics file may still grow (queued or
    running, not settled yet, or ended in the last FINAL_WINDOW: the lines its last
    seconds wrote) and has grown. One query per term, each an equality or a range on
    one index, so a round reads the live jobs, not the cluster's history (SQLite's
    planner, without statistics, scans the cluster's rows for the three terms OR-ed)."""
    added = 0
    recipe_jobs = (
        Job.objects.filter(cluster=cluster)
        .exclude(recipe="")
        .exclude(checkpoint_dir="")
        .order_by()
        .only(
            "id",
            "job_id",
            "state",
            "checkpoint_dir",
            "metrics",
            "metrics_offset",
            "cluster_id",
            "recipe",
        )
    )
    may_grow = (
        Q(state__in=ACTIVE_STATES),
        UNSETTLED,
        Q(end_time__gte=timezone.now() - FINAL_WINDOW),
    )
    jobs: dict[int, Job] = {}  # a job two terms find is read once
    for term in may_grow:
        jobs.update((job.pk, job) for job in recipe_jobs.filter(term))
    for job in jobs.values():
        try:
            added += job_metrics_ingest(job)
        except Exception:  # noqa: BLE001 - one bad run must not stop the others
            log.exception("job %s: metrics ingestion failed", job)
    return added
