"""Thin Celery tasks for recipes."""

from datetime import datetime, timedelta

from celery import shared_task
from django.conf import settings

from clusters.selectors import live_clusters
from jobs.models import Job
from mtc.polls import for_each, single_flight

from . import tensorboard
from .hang import hang_check_timed, recipe_hangs_check
from .metrics import recipe_jobs_ingest
from .straggler import recipe_stragglers_check

# A job that will be hung before the next round is judged by a check sent for that
# moment: the round's period plus a second of slack.
HANG_LOOKAHEAD_S = float(settings.CELERY_BEAT_SCHEDULE["recipe-metrics"]["schedule"]) + 1.0
# A check that starts this much before its moment (a timer's grain, the clocks of two
# processes) waits for it instead of leaving the job to the next round.
HANG_CHECK_EARLY_S = 1.0


def recipe_round(cluster) -> int:
    """One poller round for a cluster's recipe jobs: their new metrics, then the ranks'
    step times compared (stragglers), then hangs."""
    added = recipe_jobs_ingest(cluster)
    recipe_stragglers_check(cluster)
    recipe_hangs_check(cluster, check_at=hang_check_at, lookahead_s=HANG_LOOKAHEAD_S)
    return added


def hang_check_at(job_pk: int, when: datetime) -> None:
    """Judge the job for a hang at ``when`` (its threshold) on the polls queue's worker.
    Sent again by each round that sees it coming: the JobHang row makes it act once."""
    recipe_hang_check.apply_async((job_pk,), eta=when, expires=when + timedelta(seconds=30))


@shared_task(ignore_result=True)
def recipe_hang_check(job_pk: int) -> bool:
    """Whether the job (by id) was hung at its moment and its hang handled."""
    job = Job.objects.select_related("cluster").filter(pk=job_pk).first()
    return job is not None and hang_check_timed(job, early_s=HANG_CHECK_EARLY_S) is not None


@shared_task(ignore_result=True)
@single_flight("recipe-metrics")
def recipe_metrics_ingest_all() -> int:
    """Read the metrics every live cluster's recipe jobs wrote since the last round, and
    handle the ones that straggle or hang."""
    return for_each(live_clusters(), recipe_round, what="recipe metrics")


@shared_task(ignore_result=True)
def tensorboards_stop_idle() -> int:
    """Stop the TensorBoards nobody looked at for MTC_TENSORBOARD_IDLE_S (and those of
    deleted clusters)."""
    return len(tensorboard.tensorboards_stop_idle(idle_s=tensorboard.idle_seconds()))
