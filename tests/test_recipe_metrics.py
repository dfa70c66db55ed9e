"""A run's metrics.jsonl into the database, incrementally (as the poller does)."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from clusters.models import Cluster
from jobs.models import Job, JobMetric
from recipes.metrics import job_metrics_ingest, recipe_jobs_ingest

from .conftest import make_spec

pytestmark = pytest.mark.django_db


def write(path, *entries, partial: str = ""):
    with open(path, "a") as fh:
        for entry in entries:
            fh.write(json.dumps(entry) + "\n")
        fh.write(partial)


def recipe_job(tmp_path, user, cluster_id: str, number: int) -> Job:
    """A recipe job whose metrics.jsonl is tmp_path's, on a cluster row of its own."""
    cluster = Cluster.objects.create(
        cluster_id=cluster_id, spec=make_spec(cluster_id), state="RUNNING"
    )
    return Job.objects.create(
        cluster=cluster,
        job_id=str(number),
        job_number=number,
        name="r",
        owner=user,
        recipe="llama-pretrain",
        checkpoint_dir=str(tmp_path / "checkpoints"),
    )


def test_ingest_is_incremental_and_redoes_steps_after_a_resume(tmp_path, user_api, user):
    cluster = Cluster.objects.create(cluster_id="mx", spec=make_spec("mx"), state="RUNNING")
    (tmp_path / "checkpoints").mkdir()
    job = Job.objects.create(
        cluster=cluster,
        job_id="5",
        job_number=5,
        name="r",
        owner=user,
        recipe="llama-pretrain",
        checkpoint_dir=str(tmp_path / "checkpoints"),
        submitted_by_mtc=True,
    )
    metrics = tmp_path / "metrics.jsonl"
    write(
        metrics,
        {"event": "start", "step": 0, "dataset_documents": 20000, "dataset_tokens": 123456},
        *[
            {"step": s, "loss": 5.0 - s / 10, "tokens_per_s": 100.0, "mfu": 0.01}
            for s in range(1, 4)
        ],
        {"event": "checkpoint", "step": 2},
        partial='{"step": 4, "lo',
    )
    assert job_metrics_ingest(job) == 3
    assert job.metrics["first_loss"] == 4.9 and job.metrics["last_loss"] == pytest.approx(4.7)
    assert job.metrics["last_checkpoint_step"] == 2
    assert (job.metrics["dataset_documents"], job.metrics["dataset_tokens"]) == (20000, 123456)
    assert job_metrics_ingest(job) == 0  # the half-written line waits

    with open(metrics, "a") as fh:
        fh.write('ss": 4.6}\n')
    write(
        metrics,
        {"event": "resumed", "step": 2, "from_step": 2},
        {"step": 3, "loss": 4.65},
        {"step": 4, "loss": 4.55},
    )
    assert job_metrics_ingest(job) == 2  # step 4 from before the resume is dropped
    steps = list(JobMetric.objects.filter(job=job).values_list("step", "values__loss"))
    assert steps == [(1, 4.9), (2, 4.8), (3, 4.65), (4, 4.55)]
    assert job.metrics["resumed_from_step"] == 2
    assert any("resumed from the step-2 checkpoint" in e.cause for e in job.events.all())

    body = user_api.get("/api/v1/clusters/mx/jobs/5/metrics").json()
    assert [p["step"] for p in body["series"]] == [1, 2, 3, 4]
    assert body["summary"]["last_loss"] == 4.55


def test_a_diverged_loss_is_stored_as_null(tmp_path, user):
    job = recipe_job(tmp_path, user, "nx", 6)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": NaN, "grad_norm": Infinity}\n')
    assert job_metrics_ingest(job) == 1
    assert JobMetric.objects.get(job=job).values == {"loss": None, "grad_norm": None}


def test_a_line_with_a_nul_is_skipped_and_the_rest_stored(tmp_path, user):
    job = recipe_job(tmp_path, user, "zx", 7)
    # The run writes its own file: PostgreSQL's JSON would refuse the NUL of step 2.
    write(
        tmp_path / "metrics.jsonl",
        {"step": 1, "loss": 4.0},
        {"step": 2, "loss": 3.9, "note": "a\x00b"},
        {"step": 3, "loss\x00": 3.8},
        {"step": 4, "loss": 3.7},
    )
    assert job_metrics_ingest(job) == 2
    assert list(
        JobMetric.objects.filter(job=job).order_by("step").values_list("step", flat=True)
    ) == [1, 4]
    job.refresh_from_db()
    assert job.metrics["step"] == 4 and job.metrics["last_loss"] == 3.7


def test_a_line_with_a_step_no_column_holds_is_skipped_and_the_rest_stored(tmp_path, user):
    job = recipe_job(tmp_path, user, "sx", 8)
    # Each would raise in int() or overflow the column, and stop the job's later lines.
    write(
        tmp_path / "metrics.jsonl",
        {"step": 1, "loss": 4.0},
        {"step": "x", "loss": 3.9},
        {"step": 10**30, "loss": 3.9},
        {"step": -1, "loss": 3.9},
        {"step": True, "loss": 3.9},
        {"step": [2], "loss": 3.9},
        {"event": "resumed", "from_step": "²"},
        {"event": "checkpoint", "step": "x"},
        {"step": 2.0, "loss": 3.8},
        {"step": "3", "loss": 3.7},
    )
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"step": Infinity, "loss": 1}\n')
    assert job_metrics_ingest(job) == 3
    assert list(
        JobMetric.objects.filter(job=job).order_by("step").values_list("step", flat=True)
    ) == [1, 2, 3]
    job.refresh_from_db()
    assert job.metrics["step"] == 3 and "last_checkpoint_step" not in job.metrics


def test_a_round_reads_the_jobs_whose_metrics_may_still_grow(tmp_path, user):
    """Queued or running, not settled yet, or ended within the hour: read. Settled and
    ended long ago: its file is not even looked at (the round follows the live jobs)."""
    cluster = Cluster.objects.create(cluster_id="mw", spec=make_spec("mw"), state="RUNNING")
    now = timezone.now()
    cases = {
        "running": dict(state="RUNNING", settled=False, end_time=None),
        "ended-recently": dict(
            state="COMPLETED", settled=True, end_time=now - timedelta(minutes=5)
        ),
        "ended-long-ago": dict(state="COMPLETED", settled=True, end_time=now - timedelta(hours=2)),
        "not-settled-yet": dict(
            state="COMPLETED", settled=False, end_time=now - timedelta(hours=2)
        ),
    }
    jobs = {}
    for number, (name, fields) in enumerate(cases.items(), start=1):
        run = tmp_path / name
        (run / "checkpoints").mkdir(parents=True)
        write(run / "metrics.jsonl", {"step": 1, "loss": 2.0})
        jobs[name] = Job.objects.create(
            cluster=cluster,
            job_id=str(number),
            job_number=number,
            name=name,
            owner=user,
            recipe="llama-pretrain",
            checkpoint_dir=str(run / "checkpoints"),
            **fields,
        )
    assert recipe_jobs_ingest(cluster) == 3
    read = {name for name, job in jobs.items() if JobMetric.objects.filter(job=job).exists()}
    assert read == {"running", "ended-recently", "not-settled-yet"}
