"""The experiment comparison: curves overlaid (a trace per run and metric), settings side
by side with differences marked, model versions through their source job, unknown and
other users' runs reported on the page, a query count that does not grow with the runs,
and the ways there (the queue's checkboxes, the job page's links)."""

from __future__ import annotations

import json
import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from clusters.models import Cluster
from jobs.models import Job, JobMetric
from registry.models import Model, ModelVersion

from .conftest import make_spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(db) -> Cluster:
    return Cluster.objects.create(cluster_id="cmp", spec=make_spec("cmp"), state="RUNNING")


@pytest.fixture
def user_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def make_run(cluster, owner, number: int, *, lr: float, steps: int = 4, reward=False) -> Job:
    job = Job.objects.create(
        cluster=cluster,
        job_id=str(number),
        job_number=number,
        name=f"sft-{number}",
        user="slurm",
        owner=owner,
        partition="gpu",
        nodes=2,
        state="COMPLETED",
        recipe="sft",
        checkpoint_dir=f"/runs/sft-{number}/checkpoints",
        parameters={"model": "tiny", "steps": steps, "lr": lr, "seed": 1},
        metrics={"step": steps, "first_loss": 3.0, "last_loss": 3.0 - steps * 0.1 * number},
    )
    JobMetric.objects.bulk_create(
        JobMetric(
            job=job,
            step=step,
            values={"loss": 3.0 - step * 0.1 * number, "lr": lr}
            | ({"reward": 0.1 * step} if reward else {}),
        )
        for step in range(1, steps + 1)
    )
    return job


def compare_data(response) -> dict:
    match = re.search(
        r'<script id="compare-data" type="application/json">(.*?)</script>',
        response.content.decode(),
        re.S,
    )
    assert match, "the page has no chart data"
    return json.loads(match.group(1))


def table_row(html: str, label: str) -> str:
    match = re.search(rf'<tr class="(\w+)"[^>]*><th scope="row">{re.escape(label)}\b.*?</tr>', html)
    assert match, f"no row {label}"
    return match.group(0)


def test_two_jobs_overlaid_with_the_differing_parameter_marked(cluster, user, user_client):
    make_run(cluster, user, 1, lr=3e-4)
    make_run(cluster, user, 2, lr=1e-3, reward=True)

    response = user_client.get("/jobs/compare/?jobs=cmp/1,cmp/2")
    assert response.status_code == 200
    charts = {c["metric"]: c for c in compare_data(response)["charts"]}
    loss = charts["loss"]["traces"]
    assert [t["run"] for t in loss] == ["cmp/1", "cmp/2"]
    assert loss[0]["x"] == [1, 2, 3, 4]
    assert loss[1]["y"] == pytest.approx([2.8, 2.6, 2.4, 2.2])
    assert loss[0]["color"] != loss[1]["color"]
    assert [t["run"] for t in charts["reward"]["traces"]] == ["cmp/2"]  # only it reported one

    html = response.content.decode()
    lr_row = table_row(html, "lr")
    assert lr_row.startswith('<tr class="differs"') and "0.0003" in lr_row and "0.001" in lr_row
    assert table_row(html, "steps").startswith('<tr class="same"')
    assert table_row(html, "Nodes").startswith('<tr class="same"')
    assert "1 setting differs" in html


def test_unknown_forbidden_and_malformed_runs_are_reported(
    cluster, user, operator, user_client, django_user_model
):
    make_run(cluster, user, 1, lr=3e-4)
    stranger = django_user_model.objects.create_user("sam", password="pw-sam-123")
    theirs = make_run(cluster, stranger, 3, lr=5e-4)
    theirs.name = "secret-experiment"
    theirs.save()

    url = "/jobs/compare/?jobs=cmp/1,cmp/999,cmp/3,nope&versions=ghost@1,bad-version"
    response = user_client.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    text = re.search(r'data-testid="compare-problems".*?</div>', html, re.S).group(0)
    for expected in (
        "No job cmp/999 that you can see.",
        "No job cmp/3 that you can see.",
        "“nope” is not a job",
        "No model version ghost@1 that you can see.",
        "“bad-version” is not a model version",
    ):
        assert expected in text
    assert "secret-experiment" not in html
    assert [t["run"] for t in compare_data(response)["charts"][0]["traces"]] == ["cmp/1"]

    # An operator sees every user's jobs.
    staff = Client()
    staff.force_login(operator)
    both = staff.get("/jobs/compare/?jobs=cmp/1,cmp/3")
    assert [t["run"] for t in compare_data(both)["charts"][0]["traces"]] == ["cmp/1", "cmp/3"]


def test_model_versions_use_their_source_jobs_metrics(cluster, user, user_client):
    first = make_run(cluster, user, 1, lr=3e-4)
    second = make_run(cluster, user, 2, lr=1e-3)
    model = Model.objects.create(name="tiny-sft", owner=user)
    for number, job in ((1, first), (2, second)):
        ModelVersion.objects.create(
            model=model,
            number=number,
            source_job=job,
            cluster=cluster,
            recipe="sft",
            parameters=job.parameters,
            state="READY",
        )

    response = user_client.get("/jobs/compare/?versions=tiny-sft@1,tiny-sft@2")
    assert response.status_code == 200
    loss = compare_data(response)["charts"][0]["traces"]
    assert [t["run"] for t in loss] == ["tiny-sft@1", "tiny-sft@2"]
    assert loss[1]["y"] == pytest.approx([2.8, 2.6, 2.4, 2.2])
    assert "tiny-sft@1 (cmp/1)" in response.content.decode()

    # A job picked on its own and as its version is one run.
    merged = user_client.get("/jobs/compare/?jobs=cmp/1&versions=tiny-sft@1")
    assert [t["run"] for t in compare_data(merged)["charts"][0]["traces"]] == ["cmp/1"]


def test_query_count_does_not_grow_with_the_runs(cluster, user, user_client):
    for number in range(1, 9):
        make_run(cluster, user, number, lr=1e-3 * number)
    model = Model.objects.create(name="tiny", owner=user)
    for number in (1, 2, 3):
        ModelVersion.objects.create(
            model=model, number=number, source_job=Job.objects.get(job_id=str(5 + number))
        )

    def queries(url: str) -> int:
        with CaptureQueriesContext(connection) as ctx:
            response = user_client.get(url)
        assert response.status_code == 200
        return len(ctx)

    few = queries("/jobs/compare/?jobs=cmp/1,cmp/2&versions=tiny@1")
    many = queries(
        "/jobs/compare/?jobs=cmp/1,cmp/2,cmp/3,cmp/4,cmp/5&versions=tiny@1,tiny@2,tiny@3"
    )
    assert few == many <= 6  # session, user, jobs, versions, metric points, the picker


def test_queue_and_job_page_lead_to_comparison_and_tensorboard(cluster, user, user_client):
    make_run(cluster, user, 1, lr=3e-4)
    queue = user_client.get("/clusters/cmp/jobs/").content.decode()
    assert 'id="compare-form"' in queue and "Compare selected" in queue
    assert 'value="cmp/1" form="compare-form"' in queue
    fragment = user_client.get("/clusters/cmp/jobs/fragment/").content.decode()
    assert 'value="cmp/1" form="compare-form"' in fragment

    detail = user_client.get("/clusters/cmp/jobs/1/").content.decode()
    assert 'action="/clusters/cmp/jobs/1/tensorboard/"' in detail
    assert 'href="/jobs/compare/?jobs=cmp/1"' in detail

    picker = user_client.get("/jobs/compare/?jobs=cmp/1").content.decode()
    assert "Add runs" in picker
