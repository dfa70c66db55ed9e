"""The metrics API on a long run: a bounded number of points, from a bounded number of
queries, whatever the number of steps stored."""

from __future__ import annotations

import pytest

from clusters.models import Cluster
from jobs.models import Job, JobMetric
from jobs.selectors import job_metric_points

from .conftest import make_spec

pytestmark = pytest.mark.django_db

STEPS = 60_000  # enough that a full series would be sixty times the default


def _run(user, steps, *, job_id: str = "7") -> Job:
    cluster, _ = Cluster.objects.get_or_create(
        cluster_id="mm", defaults={"spec": make_spec("mm"), "state": "RUNNING"}
    )
    job = Job.objects.create(
        cluster=cluster,
        job_id=job_id,
        job_number=int(job_id),
        name="long",
        owner=user,
        recipe="llama-pretrain",
        state="RUNNING",
    )
    JobMetric.objects.bulk_create(
        (JobMetric(job=job, step=s, values={"loss": 10.0 / s}) for s in steps), batch_size=5000
    )
    return job


def _url(job: Job) -> str:
    return f"/api/v1/clusters/{job.cluster.cluster_id}/jobs/{job.job_id}/metrics"


def test_a_long_run_is_downsampled_to_the_points_asked_first_and_last_kept(
    user, user_api, django_assert_max_num_queries
):
    job = _run(user, range(1, STEPS + 1))
    with django_assert_max_num_queries(12):
        body = user_api.get(_url(job)).json()
    series = body["series"]
    assert body["downsampled"] is True and len(series) <= 1000
    assert len(series) > 900  # not far fewer than asked either
    steps = [p["step"] for p in series]
    assert steps[0] == 1 and steps[-1] == STEPS == body["last_step"]
    assert steps == sorted(set(steps))
    assert series[1]["loss"] == pytest.approx(10.0 / steps[1])
    assert body["stride"] == steps[1] - steps[0]

    few = user_api.get(_url(job), {"points": 50}).json()["series"]
    assert len(few) <= 50 and few[0]["step"] == 1 and few[-1]["step"] == STEPS


def test_a_window_of_steps_zooms_in_and_a_short_one_comes_whole(user, user_api):
    job = _run(user, range(1, STEPS + 1))
    body = user_api.get(_url(job), {"start_step": 1000, "end_step": 1499}).json()
    assert body["downsampled"] is False and body["stride"] == 1
    assert [p["step"] for p in body["series"]] == list(range(1000, 1500))


def test_a_short_run_comes_whole(user, user_api):
    job = _run(user, range(1, 21))
    body = user_api.get(_url(job)).json()
    assert body["downsampled"] is False
    assert [p["step"] for p in body["series"]] == list(range(1, 21))
    assert body["first_step"] == 1 and body["last_step"] == 20


def test_steps_logged_every_tenth_and_unevenly_are_thinned_too(user):
    every_tenth = _run(user, range(10, 50_001, 10), job_id="8")
    window = job_metric_points(every_tenth.pk, points=100)
    steps = [row[0] for row in window.rows]
    assert 50 <= len(steps) <= 100 and steps[0] == 10 and steps[-1] == 50_000
    assert all(step % 10 == 0 for step in steps)

    uneven = _run(user, [s * s for s in range(1, 3000)], job_id="9")
    window = job_metric_points(uneven.pk, points=100)
    steps = [row[0] for row in window.rows]
    assert 50 <= len(steps) <= 100 and steps[0] == 1 and steps[-1] == 2999 * 2999


@pytest.mark.parametrize("query", [{"points": "2"}, {"points": "x"}, {"start_step": "-1"}])
def test_bad_parameters_are_a_400_naming_the_field(user, user_api, query):
    job = _run(user, range(1, 6))
    response = user_api.get(_url(job), query)
    assert response.status_code == 400
    assert set(response.json()["error"]["fields"]) == set(query)


def test_many_runs_read_bounded_in_one_query(user, django_assert_max_num_queries):
    from jobs.selectors import job_metric_series

    long = _run(user, range(1, STEPS + 1), job_id="11")
    short = _run(user, range(1, 11), job_id="12")
    for job, last in ((long, STEPS), (short, 10)):
        Job.objects.filter(pk=job.pk).update(metrics={"step": last})
        job.refresh_from_db()
    with django_assert_max_num_queries(1):
        series = job_metric_series([long, short], points=500)
    assert 400 < len(series[long.pk]) <= 500
    assert series[long.pk][0][0] == 1 and series[long.pk][-1][0] == STEPS
    assert [row[0] for row in series[short.pk]] == list(range(1, 11))
