"""Enqueueing a Celery task by its name, once the current transaction commits.

Services enqueue the thin tasks that call them back; naming the task instead of
importing its module keeps every app's ``services -> tasks -> services`` free of an
import circle. Each app imports its own ``tasks`` from ``AppConfig.ready()``, so the
name is registered in every process (eager mode in tests included).
"""

from __future__ import annotations

from celery import current_app
from django.db import transaction


def task_enqueue(name: str, *args, countdown: float | None = None) -> None:
    """Send ``name(*args)`` after the surrounding transaction commits (at once outside one)."""
    task = current_app.tasks[name]  # KeyError: a task that no app registered
    transaction.on_commit(lambda: task.apply_async(args, countdown=countdown))
