"""How many jobs a cluster has, for its job list's page count, at a cost that does not
grow with its history.

COUNT(*) reads every entry of an index: on SQLite ~11 ms at 300,000 jobs, for every
list page the read cache does not answer (every submit moves the list's cache, so under
load nearly every one). A tally keeps the count of the cluster's rows up to a known row
id, in Redis (every web process shares it), and adds the rows made since, read through
the primary key. Row ids only grow, so new rows always land past the tally; what it
cannot see is a deletion, so every deletion of jobs (retention's purge, a deleted
cluster, a job whose id Slurm reused) moves a generation the tallies carry (Job's
post_delete, once a transaction). A tally is also made again once TAIL_MAX rows follow
it or after TALLY_TTL_S. Without Redis the count is made as before.
"""

from __future__ import annotations

import json
import logging

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.db.models.signals import post_delete
from django.dispatch import receiver

from clusters.models import Cluster
from mtc.redisconn import deployment_namespace, redis_client

from .models import Job

log = logging.getLogger(__name__)

TAIL_MAX = 1000  # rows past a tally read per count; past that it is made again
TALLY_TTL_S = 120  # a tally is made again at least this often
UNCOMMITTED_MARGIN = 100  # rows below the newest a tally stops at (see _tally_make)


def _client():
    return redis_client(settings.REDIS_URL, timeout=0.5)


def _namespace() -> str:
    return deployment_namespace("mtc:jobs")


def _generation_key() -> str:
    return f"{_namespace()}:tally-gen"


def _tally_key(cluster: Cluster) -> str:
    # The cluster's creation time too: a row id used again (a database restored, a
    # cluster made anew) is another tally.
    return f"{_namespace()}:tally:{cluster.pk}:{cluster.create_time.timestamp()}"


def _newer(cluster: Cluster, upto: int, limit: int | None = None) -> int | None:
    """The cluster's rows past row id ``upto``, read by the primary key's range (never
    the cluster's index); None when there are more than ``limit``."""
    newer = Job.objects.filter(pk__gt=upto).order_by().values_list("cluster_id", flat=True)
    clusters = list(newer if limit is None else newer[: limit + 1])
    if limit is not None and len(clusters) > limit:
        return None
    return sum(1 for pk in clusters if pk == cluster.pk)


def cluster_job_count(cluster: Cluster) -> int:
    """``Job.objects.filter(cluster=cluster).count()``, from the cluster's tally."""
    if not settings.MTC_JOB_TALLY:
        return Job.objects.filter(cluster=cluster).count()
    try:
        client = _client()
        generation, kept = client.mget([_generation_key(), _tally_key(cluster)])
    except Exception as exc:  # Redis away: count as before, never a 500
        log.info("job tally unavailable: %r", exc)
        return Job.objects.filter(cluster=cluster).count()
    generation = (generation or b"0").decode()
    if kept is not None:
        tally = json.loads(kept)
        if tally["g"] == generation:
            newer = _newer(cluster, tally["upto"], limit=TAIL_MAX)
            if newer is not None:
                return tally["n"] + newer
    return _tally_make(client, generation, cluster)


class ClusterTally:
    """The cluster's jobs as a paginator counts them (``count()``)."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def count(self) -> int:
        return cluster_job_count(self.cluster)


def _tally_make(client, generation: str, cluster: Cluster) -> int:
    # Short of the newest row by a margin: on PostgreSQL ids are handed out before their
    # transactions commit, so a row just below the newest may still become visible (it
    # is then in the tail). No transaction: on SQLite it would take the write lock.
    newest = Job.objects.aggregate(last=Max("pk"))["last"] or 0
    upto = max(0, newest - UNCOMMITTED_MARGIN)
    count = Job.objects.filter(cluster=cluster, pk__lte=upto).count()
    try:
        value = json.dumps({"g": generation, "upto": upto, "n": count})
        client.set(_tally_key(cluster), value, ex=TALLY_TTL_S)
    except Exception as exc:
        log.info("job tally not kept: %r", exc)
    return count + _newer(cluster, upto)


def tallies_forget() -> None:
    """Every cluster's tally is made again on its next count."""
    try:
        _client().incr(_generation_key())
    except Exception as exc:  # their TTL ends them
        log.warning("job tallies not reset (Redis said %r); they end within %d s", exc, TALLY_TTL_S)


@receiver(post_delete, sender=Job, dispatch_uid="jobs.tally")
def _job_deleted(sender, instance, using, **kwargs) -> None:
    # Once a transaction, however many jobs it deletes (retention purges thousands); a
    # rolled back one drops its callbacks, and so moves nothing.
    connection = transaction.get_connection(using)
    waiting = getattr(connection, "run_on_commit", [])
    if connection.in_atomic_block and any(entry[1] is tallies_forget for entry in waiting):
        return
    transaction.on_commit(tallies_forget, using=using, robust=True)
