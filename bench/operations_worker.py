"""An operations worker for the benches that run the control plane in one process.

In production, operations (a create, a repair with its reboot and fabric check) run on
the Celery workers of the operations queue while the poller goes on in its own worker:
a requeued job is released and watched while its node is being repaired. The benches
run Celery eagerly, which would run a repair inline inside the poll that started it and
hold the poll for the repair's whole length. ``start()`` moves the operation tasks onto
one thread of this process instead, as a worker would take them. ``start(POLL_TASKS)``
does the same for the checks a poll times to a moment (``eta``) on the polls queue.
"""

from __future__ import annotations

import logging
import queue
import threading
from datetime import UTC, datetime

from celery import current_app
from django.db import connection

log = logging.getLogger(__name__)
OPERATION_TASKS = ("clusters.tasks.operation_run",)
POLL_TASKS = ("recipes.tasks.recipe_hang_check",)


class OperationsWorker(threading.Thread):
    def __init__(self, name: str = "operations-worker") -> None:
        super().__init__(daemon=True, name=name)
        self.inbox: queue.Queue = queue.Queue()
        self.busy = threading.Event()

    def send(self, task, args, countdown: float | None = None, eta=None, **_options) -> None:
        if eta is not None:
            countdown = max((eta - datetime.now(UTC)).total_seconds(), 0.0)
        if countdown:
            threading.Timer(countdown, self.inbox.put, [(task, args)]).start()
        else:
            self.inbox.put((task, args))

    def run(self) -> None:
        while True:
            task, args = self.inbox.get()
            self.busy.set()
            try:
                task(*args)
            except Exception:  # a worker logs a failed task and takes the next
                log.exception("operation task %s%s failed", task.name, tuple(args))
            finally:
                connection.close()
                self.busy.clear()

    def idle(self) -> bool:
        return self.inbox.empty() and not self.busy.is_set()


def start(
    tasks: tuple[str, ...] = OPERATION_TASKS, name: str = "operations-worker"
) -> OperationsWorker:
    """Send ``tasks`` (the operation tasks) to a worker thread of their own from now on."""
    worker = OperationsWorker(name)
    for name in tasks:
        task = current_app.tasks[name]

        def apply_async(args=(), kwargs=None, *, _task=task, **options):
            worker.send(_task, args, **options)

        task.apply_async = apply_async
    worker.start()
    return worker
