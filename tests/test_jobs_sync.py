"""The job poller's bulk upsert (rows made directly; no Slurm needed)."""

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from clusters.models import Cluster
from jobs.models import Job, JobEvent
from jobs.sync import jobs_sync
from slurm.queue import QueueJob

from .conftest import make_spec

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def qjob(job_id: str, state: str = "PENDING", **changes) -> QueueJob:
    number, _, task = job_id.partition("_")
    base = QueueJob(
        job_id=job_id,
        job_number=int(number),
        array_task_id=int(task) if task else None,
        name="j",
        user="root",
        partition="gpu",
        state=state,
        reason="",
        nodes=1,
        node_list="",
        cpus=1,
        gpus_per_node=0,
        time_limit="UNLIMITED",
        submit_time=T0,
        start_time=None,
        end_time=None,
        exit_code="0:0",
        restart_count=0,
    )
    return replace(base, **changes)


@pytest.fixture
def cluster():
    return Cluster.objects.create(cluster_id="sy", spec=make_spec("sy"), state="RUNNING")


def test_creates_updates_and_records_history(cluster, django_assert_max_num_queries):
    with django_assert_max_num_queries(8):
        stats = jobs_sync(cluster=cluster, queue=[qjob(str(i)) for i in range(1, 301)])
    assert stats == {"created": 300, "updated": 0, "gone": 0}
    assert Job.objects.count() == 300 and JobEvent.objects.count() == 300

    queue = [qjob(str(i)) for i in range(1, 301)]
    queue[0] = qjob("1", "RUNNING", node_list="sy-gpu-0", start_time=T0)
    with django_assert_max_num_queries(8):
        stats = jobs_sync(cluster=cluster, queue=queue)
    assert stats == {"created": 0, "updated": 1, "gone": 0}
    job = Job.objects.get(job_id="1")
    assert job.state == "RUNNING" and job.node_list == "sy-gpu-0" and job.start_time == T0
    assert [e.state for e in job.events.all()] == ["PENDING", "RUNNING"]

    assert jobs_sync(cluster=cluster, queue=queue) == {"created": 0, "updated": 0, "gone": 0}


def test_query_count_does_not_grow_with_jobs(cluster, django_assert_max_num_queries):
    for size in (10, 1000):
        Job.objects.all().delete()
        with django_assert_max_num_queries(8):
            jobs_sync(cluster=cluster, queue=[qjob(str(i)) for i in range(1, size + 1)])


def test_jobs_that_leave_unseen_become_unknown(cluster):
    jobs_sync(cluster=cluster, queue=[qjob("1", "RUNNING"), qjob("2", "COMPLETED")])
    stats = jobs_sync(cluster=cluster, queue=[])
    assert stats["gone"] == 1
    assert Job.objects.get(job_id="1").state == "UNKNOWN"
    assert Job.objects.get(job_id="2").state == "COMPLETED"  # ended: nothing to guess


def test_a_name_or_node_list_longer_than_its_column_is_cut_to_fit(cluster):
    # sbatch -J on the login node takes up to 1024 characters; the column holds 200.
    name, nodes = "n" * 1024, ",".join(f"sy-gpu-{i}" for i in range(0, 400, 2))
    queue = [qjob("8", "RUNNING", name=name, node_list=nodes, reason="r" * 300)]
    assert jobs_sync(cluster=cluster, queue=queue)["created"] == 1
    job = Job.objects.get(job_id="8")
    assert (job.name, job.node_list, job.reason) == (name[:200], nodes[:500], "r" * 200)
    assert job.events.get().reason == "r" * 200
    # The next poll sees the same text: nothing changed.
    assert jobs_sync(cluster=cluster, queue=queue) == {"created": 0, "updated": 0, "gone": 0}


def test_requeues_counted(cluster):
    jobs_sync(cluster=cluster, queue=[qjob("7", "RUNNING")])
    jobs_sync(cluster=cluster, queue=[qjob("7", "PENDING", reason="BeginTime", restart_count=1)])
    job = Job.objects.get(job_id="7")
    assert job.requeue_count == 1 and job.reason == "BeginTime"


def test_a_recipe_job_requeued_by_its_script_starts_without_the_begin_time_hold(
    cluster, monkeypatch
):
    started = []

    class Client:
        def job_start_now(self, job_id):
            started.append(job_id)

    class Provider:
        def slurm(self, cluster):
            return Client()

    monkeypatch.setattr("jobs.sync.get_provider", lambda name: Provider())
    jobs_sync(cluster=cluster, queue=[qjob("7", "RUNNING"), qjob("8", "RUNNING")])
    Job.objects.filter(job_id="7").update(recipe="llama-pretrain")
    held = [qjob(i, "PENDING", reason="BeginTime", restart_count=1) for i in ("7", "8")]
    jobs_sync(cluster=cluster, queue=held)
    jobs_sync(cluster=cluster, queue=held)  # still held: asked once, when first seen
    assert started == ["7"]  # not job 8: not a recipe job


def test_array_tasks_inherit_the_arrays_owner_and_it_sums_them_up(cluster, user):
    Job.objects.create(
        cluster=cluster,
        job_id="9",
        job_number=9,
        name="sweep",
        owner=user,
        submitted_by_mtc=True,
        options={"array": "0-2"},
    )
    jobs_sync(cluster=cluster, queue=[qjob("9_0", "RUNNING"), qjob("9_1"), qjob("9_2")])
    tasks = Job.objects.filter(job_number=9, array_task_id__isnull=False)
    assert {t.owner_id for t in tasks} == {user.pk} and all(t.submitted_by_mtc for t in tasks)
    assert Job.objects.get(job_id="9").state == "RUNNING"
    jobs_sync(cluster=cluster, queue=[qjob(f"9_{i}", "COMPLETED") for i in range(3)])
    assert Job.objects.get(job_id="9").state == "COMPLETED"
    jobs_sync(
        cluster=cluster,
        queue=[qjob("9_0", "COMPLETED"), qjob("9_1", "FAILED"), qjob("9_2", "COMPLETED")],
    )
    assert Job.objects.get(job_id="9").state == "FAILED"
