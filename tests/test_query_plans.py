"""Queries that must not read a cluster's whole job history, checked on SQLite's plans.

A poll round reads the live jobs: every query a round runs on the job table finds its
rows through an index's equality or range past the cluster, or by key, on SQLite's
planner as `make run` has it (no ANALYZE statistics). With Job's default ordering, or
`NOT settled`, the planner walked every job the cluster ever had in the (cluster, job
number) index each round (~16 ms a query at 30,000 jobs).

A page of the job list reads its 50 rows from one index, with or without statistics:
an operator's from the (cluster, job number) one (with statistics and the cluster table
joined, it read and sorted every job of the cluster: ~50 ms at 30,000), a user's from
the (owner, cluster, job number) one (it walked everyone's jobs on the cluster for
theirs)."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.choices import OperationKind
from clusters.models import Cluster, Operation
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import jobs_release_requeued
from jobs.sync import jobs_sync
from recipes.tasks import recipe_round

from .conftest import make_spec
from .test_jobs_sync import acct, qjob

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        connection.vendor != "sqlite", reason="SQLite's plans; PostgreSQL plans by its statistics"
    ),
]
# A plan step that reads the job table by the cluster alone (its whole history), or all
# of it.
HISTORY_WALK = re.compile(r"^(SCAN jobs_job\b|SEARCH jobs_job USING .*\(cluster_id=\?\)$)")


@pytest.fixture
def cluster():
    cluster = Cluster.objects.create(cluster_id="pp", spec=make_spec("pp"), state="RUNNING")
    old = timezone.now() - timedelta(days=3)
    Job.objects.bulk_create(
        Job(
            cluster=cluster,
            job_id=str(n),
            job_number=n,
            state=JobState.COMPLETED,
            settled=True,
            end_time=old,
            recipe="llama-pretrain" if n % 2 else "",
            checkpoint_dir=f"/nowhere/{n}" if n % 2 else "",
        )
        for n in range(1, 201)
    )
    return cluster


def plan(sql: str) -> list[str]:
    """SQLite's plan for a captured query: one line a step."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + sql)
        return [row[-1] for row in cursor.fetchall()]


def history_walks(queries) -> list[str]:
    walks = []
    for query in queries:
        sql = query["sql"]
        if sql.startswith(("SELECT", "UPDATE", "DELETE")) and '"jobs_job"' in sql:
            walks += [f"{step}  <-  {sql[:160]}" for step in plan(sql) if HISTORY_WALK.match(step)]
    return walks


def test_the_poll_rounds_find_their_jobs_by_index(cluster):
    with CaptureQueriesContext(connection) as queries:
        jobs_sync(cluster=cluster, queue=[], accounting=lambda ids: {})
        jobs_release_requeued(cluster=cluster)
        recipe_round(cluster)
    assert len(queries) >= 5
    assert history_walks(queries.captured_queries) == []


def test_a_busy_round_finds_its_jobs_by_index(cluster):
    """A round with work to write: new jobs, a running one that changed, one that ended
    in the queue and one that left it (both settled from accounting). Its writes hold
    the database's write lock, so a walk there stalls every submit."""
    for n, state in ((1001, JobState.PENDING), (1002, JobState.RUNNING)):
        Job.objects.create(cluster=cluster, job_id=str(n), job_number=n, state=state)
    Job.objects.create(cluster=cluster, job_id="1003", job_number=1003, state=JobState.RUNNING)
    queue = [
        qjob("1001", "RUNNING", node_list="pp-gpu-0"),
        qjob("1002", "COMPLETED"),
        qjob("1004"),
        qjob("1005_1", "RUNNING"),
    ]
    answer = {job_id: acct(job_id) for job_id in ("1002", "1003")}
    with CaptureQueriesContext(connection) as queries:
        stats = jobs_sync(cluster=cluster, queue=queue, accounting=lambda ids: answer)
    assert stats == {"created": 2, "updated": 2, "gone": 1}
    assert history_walks(queries.captured_queries) == []


def test_the_check_sees_a_walk():
    """The check itself: Job's default ordering on the cluster's jobs is a walk."""
    with CaptureQueriesContext(connection) as queries:
        list(Job.objects.filter(cluster_id=1, state=JobState.RUNNING))
        list(Job.objects.filter(cluster_id=1, settled=False).order_by())
    assert len(history_walks(queries.captured_queries)) == 2


def page_plan(
    client, *, statistics: bool, path: str = "/api/v1/clusters/pp/jobs"
) -> tuple[list[dict], list[str]]:
    """GET a list (after ANALYZE when ``statistics``): the page's rows, and SQLite's
    plan for the query that read them, which must neither read a whole table nor sort."""
    if statistics:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    with CaptureQueriesContext(connection) as queries:
        response = client.get(path)
    assert response.status_code == 200
    page = [q["sql"] for q in queries.captured_queries if "LIMIT 50" in q["sql"]]
    assert len(page) == 1
    steps = plan(page[0])
    # A bare SCAN reads the whole table; one USING an index in the list's order stops at
    # the page's end.
    assert not any(step.startswith("USE TEMP B-TREE") for step in steps), steps
    assert not any(re.fullmatch(r"SCAN \w+", step) for step in steps), steps
    return response.json()["results"], steps


@pytest.mark.parametrize("statistics", [False, True], ids=["as-made", "analyzed"])
def test_a_job_list_page_reads_its_rows_by_index(cluster, statistics, operator_api):
    rows, steps = page_plan(operator_api, statistics=statistics)
    assert len(rows) == 50
    assert any("jobs_job_cluster_14a224_idx" in step for step in steps), steps


@pytest.mark.parametrize("statistics", [False, True], ids=["as-made", "analyzed"])
def test_a_users_job_list_page_skips_everyone_elses_jobs(cluster, statistics, user, user_api):
    """A user's page reads their own jobs, newest first, from one index: the history of
    everyone else's jobs on the cluster (200 here, of nobody) is not walked."""
    Job.objects.bulk_create(
        Job(cluster=cluster, job_id=str(n), job_number=n, owner=user, state=JobState.COMPLETED)
        for n in range(1001, 1061)
    )
    rows, steps = page_plan(user_api, statistics=statistics)
    assert len(rows) == 50 and rows[0]["job_id"] == "1060"
    assert {row["owner"] for row in rows} == {user.username}
    assert any("job_owner_newest" in step for step in steps), steps


@pytest.mark.parametrize("statistics", [False, True], ids=["as-made", "analyzed"])
def test_an_operations_page_reads_the_newest_by_index(cluster, statistics, operator_api):
    """Operations are kept 90 days (each repair, fabric check, create and delete makes
    one): a page of the newest reads 50 of them, not all of them sorted."""
    Operation.objects.bulk_create(
        Operation(
            kind=OperationKind.REPAIR_NODE, target=f"clusters/pp/nodes/n{n}", state="SUCCEEDED"
        )
        for n in range(120)
    )
    rows, steps = page_plan(operator_api, statistics=statistics, path="/api/v1/operations")
    assert len(rows) == 50
    assert any("operation_newest" in step for step in steps), steps
