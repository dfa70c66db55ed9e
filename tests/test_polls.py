"""Beat's polls: one run at a time (a lock in Redis), stale rounds expire, and one
cluster's failure never stops the poll of the others."""

from __future__ import annotations

import pytest
from django.conf import settings

from clusters import operations
from clusters.models import Cluster
from clusters.tasks import nodes_poll_all
from mtc import polls

from .conftest import make_spec


def test_a_second_run_is_skipped_while_the_first_holds_the_lock():
    runs = []

    @polls.single_flight("test-overlap", ttl_s=5)
    def poll(inner: bool) -> str:
        runs.append(inner)
        if not inner:
            assert poll(True) is None  # started while this run is still going
        return "done"

    assert poll(False) == "done"
    assert runs == [False]
    assert poll(True) == "done"  # the lock went with the first run


def test_without_redis_the_poll_still_runs(settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    assert polls.single_flight("test-no-redis")(lambda: 7)() == 7


def test_every_beat_entry_expires_by_its_next_round():
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        assert entry["options"]["expires"] == entry["schedule"], name


@pytest.mark.django_db
def test_one_clusters_failing_poll_does_not_stop_the_others(monkeypatch):
    for cluster_id in ("pa", "pb", "pc"):
        Cluster.objects.create(cluster_id=cluster_id, spec=make_spec(cluster_id), state="RUNNING")
    seen = []

    def sync(*, cluster):
        seen.append(cluster.cluster_id)
        if cluster.cluster_id == "pb":
            raise TimeoutError("squeue hung")
        return 2

    monkeypatch.setattr(operations, "nodes_sync", sync)
    assert nodes_poll_all() == 4
    assert seen == ["pa", "pb", "pc"]
