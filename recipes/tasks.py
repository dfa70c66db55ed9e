"""Thin Celery tasks for recipes."""

from celery import shared_task

from clusters.selectors import live_clusters
from mtc.polls import for_each, single_flight

from . import tensorboard
from .hang import recipe_hangs_check
from .metrics import recipe_jobs_ingest
from .straggler import recipe_stragglers_check


def recipe_round(cluster) -> int:
    """One poller round for a cluster's recipe jobs: their new metrics, then the ranks'
    step times compared (stragglers), then hangs."""
    added = recipe_jobs_ingest(cluster)
    recipe_stragglers_check(cluster)
    recipe_hangs_check(cluster)
    return added


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
