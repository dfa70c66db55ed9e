"""The job poller's bulk upsert (rows made directly; no Slurm needed)."""

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from clusters.models import Cluster
from jobs.models import Job, JobEvent
from jobs.services import REQUEUE_SETTLE_S, jobs_release_requeued
from jobs.sync import jobs_sync
from slurm.accounting import AccountingUnavailable, AcctJob, parse_batch_ends
from slurm.client import SlurmNode
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


def no_accounting(job_ids):
    raise AccountingUnavailable("Slurm accounting storage is disabled", configured=False)


def unreachable(job_ids):
    raise AccountingUnavailable(
        "Problem talking to the database: Connection refused", configured=True
    )


def records(**by_id) -> Callable[[list[str]], dict[str, AcctJob]]:
    """A fake sacct: the records given, for the ids asked (and counts its calls)."""

    def accounting(job_ids):
        accounting.calls.append(list(job_ids))
        return {i: r for i, r in by_id.items() if i in job_ids or i.partition("_")[0] in job_ids}

    accounting.calls = []
    return accounting


def acct(job_id: str, state: str = "COMPLETED", exit_code: str = "0:0", **changes) -> AcctJob:
    base = AcctJob(
        job_id=job_id,
        state=state,
        exit_code=exit_code,
        submit_time=T0,
        start_time=T0,
        end_time=T0 + timedelta(seconds=42),
        elapsed_s=42,
        cpu_time_s=3.5,
        max_rss_bytes=95_000_000,
        gpus=8,
    )
    return replace(base, **changes)


def test_without_accounting_jobs_that_leave_unseen_become_unknown(cluster):
    jobs_sync(cluster=cluster, queue=[qjob("1", "RUNNING"), qjob("2", "COMPLETED")])
    stats = jobs_sync(cluster=cluster, queue=[], accounting=no_accounting)
    assert stats["gone"] == 1
    job = Job.objects.get(job_id="1")
    assert job.state == "UNKNOWN" and "no accounting" in job.reason and job.settled
    assert Job.objects.get(job_id="2").state == "COMPLETED"  # ended: nothing to guess


def test_jobs_that_left_get_their_final_record_from_one_sacct_call(cluster):
    queue = [qjob("1", "RUNNING"), qjob("2", "RUNNING"), qjob("3", "COMPLETED"), qjob("4")]
    jobs_sync(cluster=cluster, queue=queue)
    sacct = records(
        **{"1": acct("1"), "2": acct("2", "FAILED", "3:0"), "3": acct("3", elapsed_s=7)}
    )
    stats = jobs_sync(cluster=cluster, queue=[qjob("4")], accounting=sacct)
    assert stats == {"created": 0, "updated": 0, "gone": 2}
    assert [sorted(ids) for ids in sacct.calls] == [["1", "2", "3"]]
    one, two, three = (Job.objects.get(job_id=i) for i in "123")
    assert (one.state, one.exit_code, one.elapsed_s, one.settled) == ("COMPLETED", "0:0", 42, True)
    assert (one.cpu_time_s, one.max_rss_bytes, one.gpus_allocated) == (3.5, 95_000_000, 8)
    assert one.end_time == T0 + timedelta(seconds=42)
    assert (two.state, two.exit_code) == ("FAILED", "3:0")
    assert three.elapsed_s == 7 and three.settled
    assert two.events.last().cause == "final record from accounting (sacct)"
    # Settled rows are read no more: the next round asks sacct nothing.
    jobs_sync(cluster=cluster, queue=[qjob("4")], accounting=sacct)
    assert len(sacct.calls) == 1


def test_unreachable_accounting_is_unknown_with_why_and_asked_again(cluster):
    jobs_sync(cluster=cluster, queue=[qjob("1", "RUNNING"), qjob("2", "COMPLETED")])
    jobs_sync(cluster=cluster, queue=[], accounting=unreachable)
    job = Job.objects.get(job_id="1")
    assert job.state == "UNKNOWN" and not job.settled
    assert (
        job.reason == "Accounting unreachable: Problem talking to the database: Connection refused"
    )
    assert Job.objects.get(job_id="2").state == "COMPLETED"  # squeue's end stands meanwhile
    sacct = records(**{"1": acct("1", "FAILED", "1:0"), "2": acct("2")})
    jobs_sync(cluster=cluster, queue=[], accounting=sacct)
    job.refresh_from_db()
    assert (job.state, job.exit_code, job.reason, job.settled) == ("FAILED", "1:0", "", True)
    assert [e.state for e in job.events.all()] == ["RUNNING", "UNKNOWN", "FAILED"]


def test_a_job_missing_from_accounting_waits_then_is_unknown(cluster, settings):
    settings.MTC_ACCOUNTING_GRACE_S = 0
    jobs_sync(cluster=cluster, queue=[qjob("1", "RUNNING")])
    jobs_sync(cluster=cluster, queue=[], accounting=records())
    job = Job.objects.get(job_id="1")
    assert job.state == "RUNNING" and job.gone_time is not None and not job.settled
    jobs_sync(cluster=cluster, queue=[], accounting=records())
    job.refresh_from_db()
    assert job.state == "UNKNOWN" and "no record" in job.reason and job.settled


def test_an_arrays_own_row_folds_its_tasks_records(cluster):
    jobs_sync(cluster=cluster, queue=[qjob("5", "RUNNING")])
    sacct = records(**{"5_0": acct("5_0"), "5_1": acct("5_1", "FAILED", "2:0", elapsed_s=50)})
    jobs_sync(cluster=cluster, queue=[], accounting=sacct)
    job = Job.objects.get(job_id="5")
    assert (job.state, job.exit_code, job.elapsed_s, job.cpu_time_s) == ("FAILED", "2:0", 50, 7.0)


def test_a_round_reads_the_queue_and_unsettled_rows_only(cluster, django_assert_max_num_queries):
    """History does not enter a round: 2,000 settled rows cost nothing."""
    Job.objects.bulk_create(
        Job(
            cluster=cluster,
            job_id=str(i),
            job_number=i,
            name="old",
            user="root",
            state="COMPLETED",
            settled=True,
        )
        for i in range(1, 2001)
    )
    queue = [qjob("3000", "RUNNING")]
    jobs_sync(cluster=cluster, queue=queue)
    with CaptureQueriesContext(connection) as ctx:
        assert jobs_sync(cluster=cluster, queue=queue) == {"created": 0, "updated": 0, "gone": 0}
    assert len(ctx.captured_queries) <= 3
    assert "old" not in str(list(Job.objects.filter(settled=False).values_list("name")))


@pytest.mark.parametrize("size", [5, 200])
def test_a_busy_rounds_queries_do_not_grow_with_the_jobs_it_settles(
    cluster, size, django_assert_max_num_queries
):
    """Per job, some settle from their final record, some leave unseen, some start: the
    rows it wrote had fields it never loaded, and reading those was a query per job and
    field (thousands a round on a busy cluster, in the write transaction)."""
    ids = [str(n) for n in range(1, 3 * size + 1)]
    jobs_sync(cluster=cluster, queue=[qjob(i, "RUNNING") for i in ids[:size]])
    jobs_sync(cluster=cluster, queue=[qjob(i, "PENDING") for i in ids[size:]], accounting=records())
    finals = records(**{i: acct(i, cpus=4) for i in ids[:size]})
    queue = [qjob(i, "RUNNING", node_list="sy-gpu-0") for i in ids[2 * size :]]
    with django_assert_max_num_queries(10):
        stats = jobs_sync(cluster=cluster, queue=queue, accounting=finals)
    assert stats == {"created": 0, "updated": size, "gone": 2 * size}
    settled = Job.objects.get(job_id="1")
    assert settled.state == "COMPLETED" and settled.settled and settled.cpus_allocated == 4
    waiting = Job.objects.get(job_id=str(size + 1))
    assert waiting.state == "PENDING" and waiting.gone_time is not None and not waiting.settled
    assert Job.objects.get(job_id=ids[-1]).node_list == "sy-gpu-0"


def test_an_ended_job_settles_while_slurm_still_shows_it_and_rounds_then_skip_it(cluster):
    """slurmctld keeps an ended job for MinJobAge (5 minutes): its final record is taken
    the round it is seen ended, and later rounds read no more than its requeue count."""
    jobs_sync(cluster=cluster, queue=[qjob("1", "RUNNING"), qjob("2", "RUNNING")])
    sacct = records(**{"1": acct("1", elapsed_s=9), "2": acct("2", "RUNNING")})
    ended = [qjob("1", "COMPLETED"), qjob("2", "COMPLETED")]
    jobs_sync(cluster=cluster, queue=ended, accounting=sacct)
    assert sacct.calls == [["1", "2"]]
    one, two = Job.objects.get(job_id="1"), Job.objects.get(job_id="2")
    assert (one.state, one.elapsed_s, one.settled) == ("COMPLETED", 9, True)
    # slurmdbd behind (its record still running): squeue's end stands, asked again.
    assert (two.state, two.settled) == ("COMPLETED", False)

    sacct = records(**{"2": acct("2")})
    jobs_sync(cluster=cluster, queue=ended, accounting=sacct)
    assert Job.objects.get(job_id="2").settled and sacct.calls == [["2"]]
    with CaptureQueriesContext(connection) as ctx:
        stats = jobs_sync(cluster=cluster, queue=ended, accounting=sacct)
    assert stats == {"created": 0, "updated": 0, "gone": 0} and len(sacct.calls) == 1
    assert len(ctx.captured_queries) <= 2, [q["sql"] for q in ctx.captured_queries]

    # Requeued after it ended (its restart count moves): followed again, settled again.
    jobs_sync(cluster=cluster, queue=[qjob("1", "PENDING", restart_count=1)], accounting=sacct)
    one.refresh_from_db()
    assert (one.state, one.requeue_count, one.settled) == ("PENDING", 1, False)
    sacct = records(**{"1": acct("1", "FAILED", "1:0")})
    again = [qjob("1", "FAILED", exit_code="1:0", restart_count=1)]
    jobs_sync(cluster=cluster, queue=again, accounting=sacct)
    one.refresh_from_db()
    assert (one.state, one.exit_code, one.settled) == ("FAILED", "1:0", True)


def test_without_accounting_an_ended_job_settles_as_squeue_ended_it(cluster):
    jobs_sync(cluster=cluster, queue=[qjob("1", "RUNNING")])
    jobs_sync(cluster=cluster, queue=[qjob("1", "TIMEOUT")], accounting=no_accounting)
    job = Job.objects.get(job_id="1")
    assert (job.state, job.settled) == ("TIMEOUT", True)


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


def test_a_job_mtc_requeued_starts_once_its_old_batch_script_cannot_end_the_new_run(
    cluster, monkeypatch
):
    """6: requeued by mtc before its last run began, 7: by someone else; both wait the
    settle time. 8 to 11: by mtc now. 8's old script's end is in accounting: at once. 9's
    is not, and its batch host could run the new run: it waits. 10's and 11's host
    cannot (drained, down): at once."""
    started = []
    no_accounting = []

    class Client:
        def batch_ends(self, job_ids):
            if no_accounting:
                raise AccountingUnavailable("disabled", configured=False)
            text = "\n".join(
                [
                    "8|RUNNING|n0",  # the allocation's line of some other run: skipped
                    "8.batch|REQUEUED|n0",
                    "8.batch|FAILED|n0",  # runs oldest first: the last is the one
                    "9.batch|REQUEUED|n0",
                    "10.batch|REQUEUED|n1",
                    "11.batch|REQUEUED|n2",
                ]
            )
            return {k: v for k, v in parse_batch_ends(text).items() if k in job_ids}

        def nodes(self):
            return [
                SlurmNode("n0", "IDLE", (), "", 2, ""),
                SlurmNode("n1", "IDLE", ("DRAIN",), "mtc: JOB_HANG", 2, ""),
                SlurmNode("n2", "DOWN", ("NOT_RESPONDING",), "", 2, ""),
            ]

        def job_start_now(self, job_id):
            started.append(job_id)

    class Provider:
        def slurm(self, cluster):
            return Client()

    monkeypatch.setattr("jobs.services.get_provider", lambda name: Provider())
    ids = ("6", "7", "8", "9", "10", "11")
    jobs_sync(cluster=cluster, queue=[qjob(i, "RUNNING") for i in ids])
    job_6 = Job.objects.get(job_id="6")
    now = timezone.now()
    before = now - timedelta(minutes=5)
    JobEvent.objects.create(job=job_6, time=before, state="REQUEUED", cause="interrupted: x")
    JobEvent.objects.filter(job=job_6, state="RUNNING").update(time=before + timedelta(minutes=1))
    for job in Job.objects.filter(job_id__in=("8", "9", "10", "11")):
        JobEvent.objects.create(job=job, time=now, state="REQUEUED", cause="interrupted: y")
    held = [qjob(i, "PENDING", reason="BeginTime", restart_count=1) for i in ids]
    jobs_sync(cluster=cluster, queue=held)
    assert jobs_release_requeued(cluster=cluster) == 3
    assert sorted(started) == ["10", "11", "8"]
    # Without accounting none of mtc's is known safe: they wait the settle time too.
    started.clear()
    no_accounting.append(True)
    assert jobs_release_requeued(cluster=cluster) == 0 and started == []
    # REQUEUE_SETTLE_S after the poller first saw them held, they are started.
    JobEvent.objects.update(time=F("time") - timedelta(seconds=REQUEUE_SETTLE_S))
    jobs_sync(cluster=cluster, queue=held)
    assert jobs_release_requeued(cluster=cluster) == 6
    assert sorted(started) == sorted(ids)


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
    slurmdbd_behind = records()  # the tasks' records not in yet: they stay unsettled
    ended = [qjob(f"9_{i}", "COMPLETED") for i in range(3)]
    jobs_sync(cluster=cluster, queue=ended, accounting=slurmdbd_behind)
    assert Job.objects.get(job_id="9").state == "COMPLETED"
    jobs_sync(
        cluster=cluster,
        queue=[qjob("9_0", "COMPLETED"), qjob("9_1", "FAILED"), qjob("9_2", "COMPLETED")],
        accounting=slurmdbd_behind,
    )
    assert Job.objects.get(job_id="9").state == "FAILED"


def test_the_job_page_shows_accounting(cluster, operator):
    from django.test import Client

    jobs_sync(cluster=cluster, queue=[qjob("1", "RUNNING")])
    jobs_sync(cluster=cluster, queue=[], accounting=records(**{"1": acct("1", elapsed_s=3725)}))
    browser = Client()
    browser.force_login(operator)
    page = browser.get("/clusters/sy/jobs/1/").content.decode()
    assert "ran 1:02:05" in page and "CPU time 0:03" in page and "8 GPUs allocated" in page
    assert "90.6" in page  # max memory, 95,000,000 bytes as MB


def test_a_job_the_submit_recorded_while_the_round_ran_does_not_undo_the_round(cluster, user):
    """squeue shows a job its submit has not recorded yet; the submit's row commits before
    the round writes: the round keeps its other work, the submit's row stays as it made it."""
    jobs_sync(cluster=cluster, queue=[qjob("1", "RUNNING")])
    sacct = records(**{"1": acct("1")})

    def submit_commits_meanwhile(job_ids):
        Job.objects.create(
            cluster=cluster, job_id="2", job_number=2, name="mine", owner=user, state="PENDING"
        )
        return sacct(job_ids)

    stats = jobs_sync(cluster=cluster, queue=[qjob("2")], accounting=submit_commits_meanwhile)
    assert stats["gone"] == 1
    assert Job.objects.get(job_id="1").state == "COMPLETED"  # the round's work landed
    mine = Job.objects.get(job_id="2")
    assert (mine.name, mine.owner) == ("mine", user)
    assert not mine.events.exists()  # no "seen by the poller" for the submit's row
