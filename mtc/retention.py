"""Retention: how long finished rows and their files are kept, and the purge that
removes what is older (README, "Retention").

Each app owns the purge of its own rows (and of the files that go with them) and
registers it here from its AppConfig.ready(), so mtc, the lowest layer, knows no
app's models. The beat task mtc.tasks.retention_purge runs every registered purge in
turn. Deletes go in batches of ``BATCH`` rows, so no statement holds a lock for long
and memory stays bounded whatever the backlog, and each run stops after its time
budget: what is left waits for the next run. Everything here may run twice (two
workers, a retried task): a row already gone is simply not found again.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from mtc import userfs

log = logging.getLogger(__name__)

BATCH = 1000  # rows per DELETE


class Budget:
    """A run's time budget: purges check it between batches and stop when it is spent."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    @property
    def spent(self) -> bool:
        return time.monotonic() >= self.deadline


@dataclass(frozen=True)
class Purge:
    name: str
    setting: str  # the Django setting (and environment variable) that holds its days
    run: Callable[[datetime, Budget], int]  # (cutoff, budget) -> rows removed


PURGES: dict[str, Purge] = {}


def purge_register(name: str, run: Callable[[datetime, Budget], int], *, setting: str) -> None:
    """An app's purge: ``run(cutoff, budget)`` removes its terminal rows older than
    ``cutoff`` (and their files) and returns how many rows went. Registering twice
    (ready() may run more than once in tests) replaces the entry."""
    PURGES[name] = Purge(name=name, setting=setting, run=run)


def retention_days(setting: str) -> float | None:
    """The setting's days; None (keep forever) when it is 0 or unset."""
    days = getattr(settings, setting, None)
    if days is None:
        return None
    days = float(days)
    return days if days > 0 else None


def retention_cutoff(setting: str, *, now: datetime | None = None) -> datetime | None:
    """What is older than this may be purged; None when it is kept forever."""
    days = retention_days(setting)
    if days is None:
        return None
    return (now or timezone.now()) - timedelta(days=days)


def window_within_retention(
    window: timedelta, *settings_names: str, margin: timedelta = timedelta(0)
) -> timedelta:
    """``window``, shortened to the shortest retention among ``settings_names`` less
    ``margin`` (what the figure reads from before its window): a figure over a window
    is then counted from rows that are all still kept, so the purge never changes it."""
    for name in settings_names:
        days = retention_days(name)
        if days is not None:
            window = min(window, max(timedelta(days=days) - margin, timedelta(hours=1)))
    return window


def batched_delete(qs: QuerySet, budget: Budget, *, batch: int = BATCH) -> int:
    """Delete the rows of ``qs`` ``batch`` at a time, until none is left or the budget
    is spent. Returns how many went (cascades not counted). The rows' own cascades go
    in the same statement: give a model with many dependent rows its own loop first."""
    model = qs.model
    deleted = 0
    while not budget.spent:
        pks = list(qs.order_by().values_list("pk", flat=True)[:batch])
        if not pks:
            break
        # The conditions again with the keys: a row that changed meanwhile stays.
        _, per_model = qs.filter(pk__in=pks).delete()
        deleted += per_model.get(model._meta.label, 0)
        if len(pks) < batch:
            break
    return deleted


def path_remove(path: Path | str, *, root: Path | str) -> bool:
    """Remove a file or a directory tree that lies under ``root`` (a cluster's folder
    in the data dir). Refuses a path outside it and a symbolic link at any level below
    it (a job's owner writes in their folder: a link must not turn the purge onto
    someone else's files); removes by descriptor (mtc.userfs), so a link swapped in
    meanwhile is not followed either. Returns whether something was removed."""
    root = Path(root).resolve()
    path = Path(path)
    try:
        relative = path.relative_to(root) if path.is_absolute() else None
    except ValueError:
        relative = None
    if relative is None or not relative.parts or ".." in relative.parts:
        return False
    try:
        return userfs.remove_below(root, relative.parts)
    except OSError as exc:
        log.warning("retention: could not remove %s: %s", path, exc)
        return False


def purge_all(*, now: datetime | None = None, budget_s: float | None = None) -> dict[str, int]:
    """Run every registered purge whose retention is not forever; {name: rows removed}.
    One purge's failure is logged and never stops the others."""
    now = now or timezone.now()
    budget = Budget(settings.MTC_RETENTION_RUN_S if budget_s is None else budget_s)
    removed: dict[str, int] = {}
    for purge in list(PURGES.values()):
        cutoff = retention_cutoff(purge.setting, now=now)
        if cutoff is None or budget.spent:
            continue
        try:
            removed[purge.name] = purge.run(cutoff, budget)
        except Exception:  # noqa: BLE001 - one app's purge must not stop the others
            log.exception("retention purge %s failed", purge.name)
    if any(removed.values()):
        log.info("retention purge: %s", removed)
    return removed


def tally_add(kind: str, counts: dict[str, int]) -> None:
    """Add ``{scope: rows}`` to the purge's tally; call it inside the delete's transaction."""
    from django.db.models import F

    from mtc.models import RetentionTally

    now = timezone.now()
    for scope, n in counts.items():
        if n <= 0:
            continue
        RetentionTally.objects.get_or_create(kind=kind, scope=scope)
        RetentionTally.objects.filter(kind=kind, scope=scope).update(
            purged=F("purged") + n, last_time=now
        )


def tally(kind: str, scope: str | None = None) -> int:
    """Rows the purge has removed (in ``scope``, or in all)."""
    from django.db.models import Sum

    from mtc.models import RetentionTally

    qs = RetentionTally.objects.filter(kind=kind)
    if scope is not None:
        qs = qs.filter(scope=scope)
    return qs.aggregate(n=Sum("purged"))["n"] or 0


# --- logs ------------------------------------------------------------------------------
CUT_CHUNK = 4 * 1024 * 1024


def log_dirs() -> list[Path]:
    """mtc's own logs (the stack `make run` starts) and each local cluster's daemon and
    agent logs (clusters/<id>/log/)."""
    data = Path(settings.DATA_DIR)
    return [data / "log", *sorted(data.glob("clusters/*/log"))]


def log_cut(path: Path, *, max_bytes: int) -> bool:
    """A log past ``max_bytes`` keeps its newest half, from a line's start, in place:
    its writers hold it open for appending (O_APPEND), so they go on writing at its new
    end. The file is shifted a chunk at a time (memory stays bounded); what a writer
    adds in the moment between the last chunk and the truncate is lost."""
    with open(path, "r+b") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size <= max_bytes:
            return False
        fh.seek(size - max_bytes // 2)
        fh.readline()  # to the next line's start
        read_at, write_at = fh.tell(), 0
        while True:
            fh.seek(read_at)
            chunk = fh.read(CUT_CHUNK)
            if not chunk:
                break
            fh.seek(write_at)
            fh.write(chunk)
            read_at += len(chunk)
            write_at += len(chunk)
        fh.truncate(write_at)
    return True


def logs_purge(cutoff: datetime, budget: Budget) -> int:
    """Log files not written since ``cutoff`` go (a removed node's); one still written
    to is cut once it passes MTC_RETENTION_LOG_MAX_MB. Returns the files removed or cut."""
    max_mb = float(getattr(settings, "MTC_RETENTION_LOG_MAX_MB", 0) or 0)
    done = 0
    for directory in log_dirs():
        if budget.spent or directory.is_symlink() or not directory.is_dir():
            continue
        for path in directory.iterdir():
            if not path.is_file() or path.is_symlink():
                continue
            try:
                if path.stat().st_mtime < cutoff.timestamp():
                    done += path_remove(path, root=directory)
                elif max_mb > 0 and log_cut(path, max_bytes=int(max_mb * 1024 * 1024)):
                    done += 1
            except OSError as exc:
                log.warning("retention: log %s: %s", path, exc)
    return done


def tally_clear(kind: str, scope: str) -> None:
    from mtc.models import RetentionTally

    RetentionTally.objects.filter(kind=kind, scope=scope).delete()
