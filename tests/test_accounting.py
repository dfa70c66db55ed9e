"""Slurm accounting against real MariaDB + slurmdbd + Slurm (scripts/test.sh starts the
first two once per run): jobs that end while no poller runs, and leave the queue before
one does, get their final state, exit code and run time from sacct."""

import os
import subprocess

import pytest

from clusters import services as cluster_services
from clusters.models import Cluster
from clusters.providers import get_provider
from jobs.models import Job
from jobs.services import requeued_startable
from jobs.sync import jobs_sync

from .conftest import cluster_root, make_spec
from .waiting import wait_until

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        not os.environ.get("MTC_SLURMDBD_PORT"),
        reason="no slurmdbd (scripts/test.sh starts one; MTC_TEST_ACCOUNTING=0 skips it)",
    ),
]


@pytest.fixture
def cluster(local_clusters):
    spec = make_spec("ac", nodes=1)
    # Finished jobs leave squeue within seconds, not Slurm's default 5 minutes.
    spec["orchestrator_spec"]["slurm_spec"]["config_overrides"] = {"MinJobAge": 2}
    cluster_services.cluster_create(spec=spec)
    return Cluster.objects.get(cluster_id="ac")


def sbatch(script: str, *args: str) -> str:
    conf = cluster_root("ac") / "etc" / "slurm.conf"
    out = subprocess.run(
        ["sbatch", "--parsable", "--output=/dev/null", *args, "--wrap", script],
        env=dict(os.environ, SLURM_CONF=str(conf)),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.strip().split(";")[0]


def test_jobs_that_end_unseen_get_their_end_from_sacct(cluster, operator_api):
    conf = (cluster_root("ac") / "etc" / "slurm.conf").read_text()
    assert "AccountingStorageType=accounting_storage/slurmdbd" in conf
    assert "AccountingStorageTRES=gres/gpu" in conf
    ok = sbatch("sleep 2")
    bad = sbatch("sleep 2; exit 3")
    array = sbatch("sleep 2", "--array=0-1")
    tasks = [f"{array}_0", f"{array}_1"]
    jobs_sync(cluster=cluster)  # the poller sees them queued or running
    assert all(j.state != "COMPLETED" for j in Job.objects.filter(cluster=cluster))

    # Workers stopped: nobody polls while the jobs end and Slurm forgets them.
    client = get_provider(cluster.provider).slurm(cluster)
    wait_until(
        lambda: not {ok, bad, array, *tasks} & {q.job_id for q in client.queue()},
        what=lambda: f"jobs {ok} and {bad} to leave squeue: {client.queue()}",
        timeout=90,
        every=1,
    )

    jobs_sync(cluster=cluster)  # the next round
    done, failed = Job.objects.get(job_id=ok), Job.objects.get(job_id=bad)
    assert (done.state, done.exit_code, done.settled) == ("COMPLETED", "0:0", True)
    assert (failed.state, failed.exit_code) == ("FAILED", "3:0")
    assert done.elapsed_s >= 2 and failed.elapsed_s >= 2
    assert done.end_time and done.start_time and done.end_time > done.start_time
    assert Job.objects.filter(job_number=int(array)).count() == 2
    for task in Job.objects.filter(job_number=int(array)):  # tasks: 12_0 in sacct too
        assert (task.state, task.exit_code, task.settled) == ("COMPLETED", "0:0", True), task
        assert task.elapsed_s >= 2
    assert not Job.objects.filter(state="UNKNOWN").exists()
    body = operator_api.get(f"/api/v1/clusters/ac/jobs/{bad}").json()
    assert (body["state"], body["exit_code"]) == ("FAILED", "3:0")
    assert body["elapsed_s"] >= 2 and "max_rss_bytes" in body and "cpu_time_s" in body


def test_a_requeued_jobs_old_batch_script_counts_as_ended_once_slurmctld_has_its_end(
    cluster, tmp_path
):
    """The script takes 5 s to end after the requeue's SIGTERM: until its end reaches
    slurmctld, the new run may not start (its completion would end the new run)."""
    ready = tmp_path / "trap-set"
    job = sbatch(f"trap 'sleep 5; exit 3' TERM; touch {ready}; sleep 300 & wait", "--requeue")
    client = get_provider(cluster.provider).slurm(cluster)
    wait_until(ready.exists, what="the batch script's trap set", timeout=60)
    client.control("requeue", job)
    assert client.batch_ends([job])[job].state == "REQUEUED"  # for now
    assert requeued_startable(client, [job]) == set()  # its node could run the new run

    def ended():
        end = client.batch_ends([job])[job]
        return end if end.ended else None

    end = wait_until(ended, what="the old script's end", timeout=60)
    assert (end.state, end.host) == ("FAILED", "ac-gpu-0")
    assert requeued_startable(client, [job]) == {job}
    client.control("cancel", job)
