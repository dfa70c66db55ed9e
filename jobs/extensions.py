"""Places where apps above jobs add to job pages, so jobs never imports them.

The recipes app registers the Training card and the chart data of a recipe job here
from its AppConfig.ready().
"""

from __future__ import annotations

from collections.abc import Callable

from .models import Job

JobContext = Callable[[Job], dict]

# The detail page and its live fragment: must not query per call.
job_card_parts: list[JobContext] = []
# The full detail page only: may read the job's series (one query each).
job_series_parts: list[JobContext] = []


def _merged(parts: list[JobContext], job: Job) -> dict:
    context: dict = {}
    for part in parts:
        context.update(part(job))
    return context


def job_card_context(job: Job) -> dict:
    return _merged(job_card_parts, job)


def job_series_context(job: Job) -> dict:
    return _merged(job_series_parts, job)


# Files a finished job leaves besides its output (recipes: the run directory), removed
# with its row by the retention purge (jobs.retention). Each part: job -> paths.
JobFiles = Callable[[Job], list]
job_file_parts: list[JobFiles] = []

# Jobs an app above keeps however old (registry: a job a model version came from), as
# a filter matching them: the purge leaves those rows and their files alone.
JobKeep = Callable[[], object]  # -> django.db.models.Q
job_keep_parts: list[JobKeep] = []
