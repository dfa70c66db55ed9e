"""Enqueueing a Celery task by its name, once the current transaction commits.

Services enqueue the thin tasks that call them back; naming the task instead of
importing its module keeps every app's ``services -> tasks -> services`` free of an
import circle. Each app imports its own ``tasks`` from ``AppConfig.ready()``, so the
name is registered in every process (eager mode in tests included).
"""

from __future__ import annotations

import logging

import redis
from celery import current_app, current_task
from django.db import transaction
from kombu.exceptions import OperationalError

log = logging.getLogger(__name__)
PING_TIMEOUT_S = 0.5


class QueueUnavailable(Exception):
    """The task queue (Redis) does not answer: a write that needs a worker is refused
    (HTTP 503) before anything is made."""


def queue_require() -> None:
    """Raise QueueUnavailable unless the broker answers now. Called before a service
    writes rows that only a worker can carry on (a cluster create, an endpoint)."""
    if current_app.conf.task_always_eager:
        return
    try:
        redis.Redis.from_url(
            current_app.conf.broker_url,
            socket_timeout=PING_TIMEOUT_S,
            socket_connect_timeout=PING_TIMEOUT_S,
        ).ping()
    except redis.RedisError as exc:
        raise QueueUnavailable(
            "The task queue (Redis) is not reachable; nothing was changed. Try again shortly."
        ) from exc


def task_enqueue(name: str, *args, countdown: float | None = None) -> None:
    """Send ``name(*args)`` after the surrounding transaction commits (at once outside one).
    The broker lost between the check and the send: the row stays as written, and the
    periodic reconcile queues it once the broker is back (a write never half-fails)."""
    task = current_app.tasks[name]  # KeyError: a task that no app registered

    def send() -> None:
        try:
            task.apply_async(args, countdown=countdown, retry=False)
        except (OperationalError, redis.RedisError) as exc:
            log.warning("%s%s not queued (%s); the reconcile picks it up", name, args, exc)

    transaction.on_commit(send)


# Tasks a poll fans out, one per row: {task: the polls that send it}. Sent from within
# such a poll they stay on its queue; sent by a request (a user's change) they are
# operations (settings.CELERY_TASK_ROUTES).
POLL_FANOUT = {
    "serving.tasks.endpoint_reconcile": {"serving.tasks.endpoints_reconcile_all"},
    "recipes.tasks.recipe_hang_check": {"recipes.tasks.recipe_metrics_ingest_all"},
}


def route_poll_fanout(name, args, kwargs, options, task=None, **kw) -> dict | None:
    """Celery router: ``polls`` for a fan-out task sent by the poll that fans it out."""
    senders = POLL_FANOUT.get(name)
    if senders and current_task and current_task.name in senders:
        return {"queue": "polls"}
    return None
