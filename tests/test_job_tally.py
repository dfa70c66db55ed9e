"""A cluster's job count from its tally (jobs/tally.py) against the Redis `make test`
starts: the same number COUNT(*) gives, after new jobs, other clusters' jobs and
deletions, without reading the cluster's history once the tally is made."""

from __future__ import annotations

import secrets

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from clusters.models import Cluster
from jobs import tally
from jobs.choices import JobState
from jobs.models import Job
from mtc.devstack import free_port

from .conftest import make_spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def tally_on(settings, monkeypatch):
    settings.MTC_JOB_TALLY = True
    namespace = f"mtc:jobs:test-{secrets.token_hex(4)}"  # no other test's tallies
    monkeypatch.setattr(tally, "_namespace", lambda: namespace)
    return settings


def cluster_with_jobs(name: str, count: int, first: int = 1) -> Cluster:
    cluster = Cluster.objects.filter(cluster_id=name).first() or Cluster.objects.create(
        cluster_id=name, spec=make_spec(name), state="RUNNING"
    )
    add_jobs(cluster, count, first)
    return cluster


def add_jobs(cluster: Cluster, count: int, first: int) -> None:
    Job.objects.bulk_create(
        Job(cluster=cluster, job_id=str(n), job_number=n, state=JobState.COMPLETED)
        for n in range(first, first + count)
    )


def test_the_count_follows_new_jobs_and_ignores_other_clusters(tally_on):
    mine = cluster_with_jobs("ta", 300)
    cluster_with_jobs("tb", 40)
    assert tally.cluster_job_count(mine) == 300
    add_jobs(mine, 7, first=1000)
    cluster_with_jobs("tb", 5, first=1000)
    with CaptureQueriesContext(connection) as queries:
        assert tally.cluster_job_count(mine) == 307
    # Only the rows made since the tally, by the primary key: no COUNT over the cluster.
    assert len(queries) == 1
    assert "COUNT" not in queries[0]["sql"].upper()
    assert '"jobs_job"."id" >' in queries[0]["sql"]


def test_a_deletion_is_counted_at_once(tally_on, django_capture_on_commit_callbacks):
    mine = cluster_with_jobs("ta", 50)
    assert tally.cluster_job_count(mine) == 50
    with django_capture_on_commit_callbacks(execute=True) as moved:
        Job.objects.filter(cluster=mine, job_number__lte=20).delete()
    assert len(moved) == 1  # once for the 20 rows
    assert tally.cluster_job_count(mine) == 30


def test_a_long_tail_makes_the_tally_again(tally_on):
    mine = cluster_with_jobs("ta", 10)
    assert tally.cluster_job_count(mine) == 10
    add_jobs(mine, tally.TAIL_MAX + 5, first=100)
    assert tally.cluster_job_count(mine) == 10 + tally.TAIL_MAX + 5
    with CaptureQueriesContext(connection) as queries:
        assert tally.cluster_job_count(mine) == 10 + tally.TAIL_MAX + 5
    assert len(queries) == 1  # the tally made anew covers them


def test_without_redis_the_jobs_are_counted(tally_on):
    tally_on.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    mine = cluster_with_jobs("ta", 12)
    assert tally.cluster_job_count(mine) == 12


def test_the_operators_job_list_counts_from_the_tally(tally_on, operator):
    mine = cluster_with_jobs("ta", 60)
    Job.objects.filter(cluster=mine, job_number__lte=3).update(state=JobState.RUNNING)
    api = APIClient()
    api.force_authenticate(operator)
    assert api.get("/api/v1/clusters/ta/jobs").json()["count"] == 60
    add_jobs(mine, 2, first=500)
    with CaptureQueriesContext(connection) as queries:
        assert api.get("/api/v1/clusters/ta/jobs").json()["count"] == 62
    assert not [q for q in queries if q["sql"].upper().startswith("SELECT COUNT")]
    # A filtered list counts its own rows.
    assert api.get("/api/v1/clusters/ta/jobs?state=RUNNING").json()["count"] == 3
