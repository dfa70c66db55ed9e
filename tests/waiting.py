"""The one way tests wait: ask again until the answer is there, or fail saying what was
awaited and what was last seen. (No sleep-then-assert: a fixed sleep is either too short
on a busy machine or wasted on an idle one.)"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T],
    *,
    what: str | Callable[[], str],
    timeout: float = 30,
    every: float = 0.2,
    before: Callable[[], object] | None = None,
) -> T:
    """Call ``before`` (a poll round, say) and then ``condition`` until the condition returns
    something truthy, and return that; after ``timeout`` seconds fail with ``what`` (a
    callable is called then, to describe the state at the end)."""
    deadline = time.monotonic() + timeout
    while True:
        if before is not None:
            before()
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for " + _text(what))
        time.sleep(every)


def job_wait_state(cluster, job_id: str, states: set[str], *, timeout: float = 30):
    """Play the job poller (tests run no Celery worker) until the job is in ``states``."""
    from jobs.models import Job
    from jobs.sync import jobs_sync

    def job():
        return Job.objects.get(cluster=cluster, job_id=job_id)

    def arrived():
        current = job()
        return current if current.state in states else None

    return wait_until(
        arrived,
        before=lambda: jobs_sync(cluster=cluster),
        what=lambda: f"job {job_id} to be {sorted(states)}; it is {job().state}",
        timeout=timeout,
    )


def _text(what: str | Callable[[], str]) -> str:
    return what() if callable(what) else what
