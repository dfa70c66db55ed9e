"""Usage (GET /api/v1/usage, the Usage page and its CSV) and job efficiency, from job
rows as the poller stores them after sacct (no Slurm here; tests/test_usage_slurm.py
checks the figures against a real sacct)."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from jobs.models import Job

from .pages import assert_loads_nothing_remote
from .test_pages import make_cluster

pytestmark = pytest.mark.django_db

WINDOW = {"start": "2026-11-30", "end": "2026-12-06"}  # Monday to Sunday


def finished(
    cluster, job_id: str, *, end: str, elapsed: int | None, gpus: int, cpus: int, **fields
):
    """A finished job as settle stores it from sacct; ``end`` as 2026-12-01T10:00."""
    number, _, task = job_id.partition("_")
    values = dict(
        cluster=cluster,
        job_id=job_id,
        job_number=int(number),
        array_task_id=int(task) if task else None,
        name="train",
        user="slurm",
        partition="gpu",
        state="COMPLETED",
        exit_code="0:0",
        cpus=cpus,
        end_time=datetime.fromisoformat(end).replace(tzinfo=UTC),
        elapsed_s=elapsed,
        cpu_time_s=elapsed * cpus / 2 if elapsed is not None else None,
        gpus_allocated=gpus,
        cpus_allocated=cpus,
        settled=True,
    )
    values.update(fields)
    return Job.objects.create(**values)


@pytest.fixture
def jobs(operator, user):
    cluster = make_cluster("u1")
    other = make_cluster("u2")
    # uma: 2 GPUs x 1 h on Tuesday, 4 GPUs x 30 min on Wednesday.
    finished(cluster, "1", end="2026-12-01T10:00", elapsed=3600, gpus=2, cpus=4, owner=user)
    finished(cluster, "2", end="2026-12-02T23:59", elapsed=1800, gpus=4, cpus=2, owner=user)
    # olga: 8 GPUs x 15 min on Tuesday, in partition debug.
    finished(
        cluster,
        "3",
        end="2026-12-01T12:00",
        elapsed=900,
        gpus=8,
        cpus=1,
        owner=operator,
        partition="debug",
        account="llm",
    )
    # An array: the tasks count, the array's own row (their fold) does not.
    finished(cluster, "4", end="2026-12-03T00:30", elapsed=3600, gpus=1, cpus=1, owner=user)
    for task in (0, 1):
        finished(
            cluster, f"4_{task}", end="2026-12-03T00:30", elapsed=3600, gpus=1, cpus=1, owner=user
        )
    # Outside the window, on another cluster, or still without a record: never counted.
    finished(cluster, "5", end="2026-12-07T00:00", elapsed=3600, gpus=8, cpus=8, owner=user)
    finished(other, "1", end="2026-12-01T10:00", elapsed=3600, gpus=8, cpus=8, owner=user)
    finished(cluster, "6", end="2026-12-01T10:00", elapsed=None, gpus=8, cpus=8, owner=user)
    return cluster


def usage(api, **params):
    return api.get("/api/v1/usage", {"cluster": "u1", **WINDOW, **params})


def test_usage_per_user_and_day(jobs, operator_api):
    response = usage(operator_api)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["attribution"] == "end" and len(body["buckets"]) == 7
    rows = {(r["group"], r["bucket"]): r for r in body["rows"]}
    assert set(rows) == {
        ("slurm", "2026-12-01"),
        ("slurm", "2026-12-02"),
        ("slurm", "2026-12-03"),
    }
    tuesday = rows[("slurm", "2026-12-01")]
    assert (tuesday["gpu_hours"], tuesday["cpu_hours"], tuesday["jobs"]) == (4.0, 4.25, 2)
    assert rows[("slurm", "2026-12-03")]["gpu_hours"] == 2.0  # 2 tasks, not the array row
    assert body["totals"] == {"gpu_hours": 8.0, "cpu_hours": 7.25, "jobs": 5}


def test_usage_per_partition_account_and_week(jobs, operator_api):
    body = usage(operator_api, group_by="partition", bucket="week").json()
    assert body["buckets"] == ["2026-11-30"]
    assert {g["group"]: g["gpu_hours"] for g in body["groups"]} == {"debug": 2.0, "gpu": 6.0}
    assert {r["bucket"] for r in body["rows"]} == {"2026-11-30"}
    accounts = usage(operator_api, group_by="account").json()
    assert {g["group"]: g["jobs"] for g in accounts["groups"]} == {"": 4, "llm": 1}


def test_users_see_their_own_usage(jobs, user_api):
    body = usage(user_api).json()
    assert body["totals"] == {"gpu_hours": 6.0, "cpu_hours": 7.0, "jobs": 4}


def test_members_of_an_account_see_its_usage_too(jobs, user, user_api):
    from clusters.models import SlurmAccount

    SlurmAccount.objects.create(name="llm").members.add(user)
    body = usage(user_api).json()  # olga's job under llm: 8 GPUs x 15 min, 1 CPU
    assert body["totals"] == {"gpu_hours": 8.0, "cpu_hours": 7.25, "jobs": 5}


def test_usage_query_count_does_not_grow_with_rows(jobs, operator_api, operator):
    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert usage(operator_api).status_code == 200
        return len(ctx.captured_queries)

    queries()  # the token's first use writes its last use
    before = queries()
    for i in range(100, 140):
        finished(jobs, str(i), end="2026-12-04T08:00", elapsed=60, gpus=1, cpus=1, user=f"u{i}")
    assert queries() == before <= 4


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"start": "2026-13-01"}, "start"),
        ({"end": "yesterday"}, "end"),
        ({"start": "2026-12-06", "end": "2026-12-01"}, "start"),
        ({"group_by": "team"}, "group_by"),
        ({"bucket": "month"}, "bucket"),
        ({"cluster": ""}, "cluster"),
        ({"cluster": "Bad_Id"}, "cluster"),
        ({"start": "0001-01-01"}, "start"),
        ({"end": "9999-12-31"}, "end"),
    ],
)
def test_bad_usage_parameters_are_400_naming_the_field(operator_api, params, field):
    response = usage(operator_api, **params)
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]


def test_unknown_cluster_is_404(operator_api):
    assert usage(operator_api, cluster="nope").status_code == 404


def test_usage_page_table_totals_and_csv(jobs, user):
    client = Client()
    client.force_login(user)
    query = {"cluster": "u1", **WINDOW}
    page = client.get("/usage/", query)
    assert page.status_code == 200
    text = page.content.decode()
    assert text.count('data-testid="usage-row"') == 3  # uma's three days
    total = text.split('data-testid="usage-total"')[1].split("</tr>")[0]
    assert "6.00" in total and "7.00" in total and ">4<" in total
    assert 'id="usage-data"' in text and "/vendor/plotly.min.js" in text
    assert '"barmode": "stack"' not in text  # drawn client-side
    assert_loads_nothing_remote(text)
    response = client.get("/usage.csv", query)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    lines = list(csv.reader(io.StringIO(response.content.decode())))
    assert lines == [
        ["user", "bucket", "gpu_hours", "cpu_hours", "jobs"],
        ["slurm", "2026-12-01", "2.0", "4.0", "1"],
        ["slurm", "2026-12-02", "2.0", "1.0", "1"],
        ["slurm", "2026-12-03", "2.0", "2.0", "2"],
    ]
    bad = client.get("/usage/", {**query, "bucket": "month"})
    assert bad.status_code == 400 and "<code>bucket</code>" in bad.content.decode()
    assert client.get("/usage/", {**query, "cluster": "nope"}).status_code == 404


def test_efficiency_in_the_job_api_and_page(jobs, operator_api, operator):
    job = Job.objects.get(cluster=jobs, job_id="1")
    job.max_rss_bytes, job.mem_allocated_bytes = 1 << 30, 4 << 30
    job.save()
    body = operator_api.get("/api/v1/clusters/u1/jobs/1").json()
    assert body["efficiency"] == {
        "cpu_efficiency": 0.5,  # cpu_time_s = elapsed x cpus / 2
        "cpu_hours": 4.0,
        "memory_efficiency": 0.25,
        "max_rss_bytes": 1 << 30,
        "mem_allocated_bytes": 4 << 30,
        "gpu_hours": 2.0,
    }
    assert (body["cpus_allocated"], body["mem_allocated_bytes"]) == (4, 4 << 30)
    listed = operator_api.get("/api/v1/clusters/u1/jobs", {"state": "COMPLETED"}).json()
    assert any(row["efficiency"] for row in listed["results"])
    pending = operator_api.get("/api/v1/clusters/u1/jobs/6").json()
    assert pending["efficiency"] is None  # no accounting record yet
    client = Client()
    client.force_login(operator)
    text = client.get("/clusters/u1/jobs/1/").content.decode()
    line = text.split('data-testid="job-efficiency"')[1].split("</dd>")[0].replace("\xa0", " ")
    assert "CPU 50 % of 4 CPUs" in line and "1.0 GB of 4.0 GB (25 %)" in line
    assert "2.00 GPU-hours" in line
