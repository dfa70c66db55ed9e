"""Hang detection on a real local cluster: a 2-node llama-pretrain job, one rank stopped
(the `hang` fault: SIGSTOP), found by the poller, its stacks in the job's output, the
job requeued without that rank's node, where it completes, and the node marked JOB_HANG."""

import re
from pathlib import Path

import pytest

from clusters import services as cluster_services
from clusters.models import Cluster, Node
from clusters.providers import get_provider
from health.faults import fault_clear, fault_inject
from health.models import NodeFailure
from jobs.models import Job, JobEvent, JobHang
from jobs.tasks import jobs_round
from recipes.tasks import recipe_round

from .conftest import cluster_root, make_spec
from .waiting import wait_until

pytestmark = pytest.mark.slurm
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}


@pytest.fixture
def cluster(local_clusters, settings):
    settings.MTC_IDENTITY = "local"
    settings.MTC_HANG_FLOOR_S = 6  # the default floor is 60 s
    cluster_services.cluster_create(spec=make_spec("hx", nodes=3))
    return Cluster.objects.get(cluster_id="hx")


def poller(cluster) -> None:
    # The job poller's round (its sync, then requeued jobs released: without that, mtc's
    # requeue waits out Slurm's ~2-minute hold), then the recipes' (metrics, hangs).
    jobs_round(cluster)
    recipe_round(cluster)


def job_of(cluster, job_id: str, until, what: str, timeout: float = 240) -> Job:
    def arrived():
        job = Job.objects.get(cluster=cluster, job_id=job_id)
        assert job.state not in TERMINAL or until(job), (job.state, output(job))
        return job if until(job) else None

    return wait_until(
        arrived, before=lambda: poller(cluster), what=what, timeout=timeout, every=0.3
    )


def output(job: Job) -> str:
    """The job's output files, then where its states came from (mtc's events, and
    slurmctld's log lines for it): what a failure needs to be understood."""
    root = Path(job.checkpoint_dir).parents[2] / "output"
    files = [
        f"== {p.name}\n{p.read_text()[-3000:]}" for p in sorted(root.glob(f"slurm-{job.job_id}.*"))
    ]
    events = [
        f"{e.time:%H:%M:%S.%f} {e.state} {e.reason} {e.cause}"
        for e in JobEvent.objects.filter(job=job).order_by("time", "id")
    ]
    log = cluster_root(job.cluster.cluster_id) / "log" / "slurmctld.log"
    mine = re.compile(rf"JobId={job.job_id}\b|job {job.job_id}\b")
    lines = [line for line in log.read_text().splitlines() if mine.search(line)]
    return "\n".join([*files, "== events", *events, "== slurmctld", *lines[-40:]])


def hostnames(cluster, node_list: str) -> list[str]:
    slurm = get_provider(cluster.provider).slurm(cluster)
    return slurm.run(["scontrol", "show", "hostnames", node_list]).stdout.split()


def test_a_stopped_rank_is_named_and_the_job_completes_without_its_node(
    cluster, user_api, operator_api, client, user
):
    refused = operator_api.post(
        "/api/v1/clusters/hx/nodes/hx-gpu-0/faults", {"kind": "hang"}, format="json"
    )
    assert refused.status_code == 400 and "no training process" in str(refused.json())
    response = user_api.post(
        "/api/v1/clusters/hx/recipes/llama-pretrain/launch",
        {"nodes": 2, "overrides": {"steps": 150, "checkpoint_interval": 10}},
        format="json",
    )
    assert response.status_code == 201, response.content
    job_id = response.json()["job_id"]
    job = job_of(
        cluster, job_id, lambda j: j.metrics.get("last_checkpoint_step", 0) >= 10, "step 10"
    )
    first_nodes = hostnames(cluster, job.node_list)
    victim = Node.objects.get(cluster=cluster, name=first_nodes[1])
    fault_inject(node=victim, kind="hang")  # rank 1 (torchrun: node rank 1, one per node)
    try:
        hang = wait_until(
            lambda: JobHang.objects.filter(job=job).first(),
            before=lambda: poller(cluster),
            what="the hang found",
            timeout=90,
            every=0.5,
        )
        assert (hang.rank, hang.node, hang.state) == (1, victim.name, JobHang.REQUEUED), hang.why
        assert "wrote no stacks" in hang.why
        assert hang.threshold_s >= 6 and hang.step >= 10
        # The peer's stacks: waiting in the collective, in the job's error output.
        err = (Path(job.checkpoint_dir).parents[2] / "output" / f"slurm-{job_id}.err").read_text()
        assert f"mtc: job {job_id} hung" in err and f"rank 1 on {victim.name}" in err
        assert "--- rank 0" in err and "node/train/train.py" in err
        assert "(no stacks: the rank did not answer)" in err
        assert JobEvent.objects.filter(job=job, cause__contains=f"without {victim.name}").exists()
        client.force_login(user)  # the job's page shows the hang and the stacks
        page = client.get(f"/clusters/hx/jobs/{job_id}/").content.decode()
        assert 'data-testid="job-hang"' in page and f">{victim.name}</a>" in page
        assert "node/train/train.py" in page and "rank 1" in page

        done = job_of(
            cluster,
            job_id,
            lambda j: j.state in TERMINAL and j.metrics.get("done"),
            "completed after the requeue",
            timeout=300,
        )
        assert done.state == "COMPLETED", output(done)
        assert victim.name not in hostnames(cluster, done.node_list)
        assert done.metrics["step"] == 150 and done.metrics["resumed_from_step"] >= 10
        assert JobHang.objects.filter(job=job).count() == 1  # later rounds: no second one
        # The node is marked once the job has left it (its repair then reboots it).
        failure = wait_until(
            lambda: NodeFailure.objects.filter(node=victim, mode="JOB_HANG").first(),
            before=lambda: poller(cluster),
            what="JOB_HANG on the node",
        )
        assert f"job {job_id} rank 1" in failure.message and "wrote no stacks" in failure.message
    finally:
        fault_clear(node=victim, kind="hang")
