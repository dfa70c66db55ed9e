"""Recipes end to end on a real 2-node local cluster: launch through the API, Slurm
runs srun + torchrun on both nodes, the poller stores the metrics."""

import json
import sys
from pathlib import Path

import pytest

from clusters import services as cluster_services
from clusters.models import Cluster
from clusters.providers import get_provider
from identity.models import PosixAccount
from jobs.models import Job, JobEvent, JobMetric
from jobs.tasks import jobs_round
from recipes.metrics import recipe_jobs_ingest

from .conftest import make_spec
from .waiting import wait_until

pytestmark = pytest.mark.slurm
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "UNKNOWN"}


@pytest.fixture
def cluster(local_clusters, settings):
    settings.MTC_IDENTITY = "local"
    # Jobs write in a run root outside mtc's data dir, as on shared storage.
    run_root = Path(settings.DATA_DIR).parent / "runs-rx"
    cluster_services.cluster_create(
        spec=make_spec("rx", nodes=2, storage={"run_root": str(run_root)})
    )
    return Cluster.objects.get(cluster_id="rx")


def launch(api, recipe: str, nodes: int = 2, **overrides) -> str:
    response = api.post(
        f"/api/v1/clusters/rx/recipes/{recipe}/launch",
        {"nodes": nodes, "overrides": overrides},
        format="json",
    )
    assert response.status_code == 201, response.content
    return response.json()["job_id"]


def poll(cluster, job_id: str, until, timeout: float = 240) -> Job:
    """Play the poller (no Celery worker in tests) until ``until(job)`` holds."""

    def arrived() -> Job | None:
        job = Job.objects.get(cluster=cluster, job_id=job_id)
        if until(job):
            return job
        if job.state in TERMINAL:  # ended early: everything there is to know, in full
            print(f"events: {history(job)}\n{output(job, 20000)}", file=sys.stderr)
        assert job.state not in TERMINAL, job.state
        return None

    return wait_until(
        arrived,
        before=lambda: (
            jobs_round(cluster),  # the poller's: sync, then release requeued jobs
            recipe_jobs_ingest(cluster),
        ),
        what=lambda: f"job {job_id}; it is {Job.objects.get(cluster=cluster, job_id=job_id).state}",
        timeout=timeout,
        every=0.3,
    )


def finished(cluster, job_id: str) -> Job:
    job = poll(cluster, job_id, lambda j: j.state in TERMINAL and j.metrics.get("done"))
    assert job.state == "COMPLETED", output(job)
    return job


def output(job: Job, tail: int = 3000) -> str:
    root = Path(job.checkpoint_dir).parents[2] / "output"
    return "\n".join(
        f"== {p.name}\n{p.read_text()[-tail:]}" for p in sorted(root.glob(f"slurm-{job.job_id}.*"))
    )


def history(job: Job) -> list[tuple[str, str, str]]:
    """What the poller saw, in order: (state, reason, cause)."""
    return list(
        JobEvent.objects.filter(job=job).order_by("pk").values_list("state", "reason", "cause")
    )


def loss_at(job: Job, step: int) -> float:
    return JobMetric.objects.get(job=job, step=step).values["loss"]


def test_pretrain_on_two_nodes_then_an_exact_resume_after_requeue(cluster, user_api, settings):
    first = finished(cluster, launch(user_api, "llama-pretrain", steps=60, checkpoint_interval=10))
    summary = first.metrics
    assert Path(first.checkpoint_dir).is_relative_to(Path(settings.DATA_DIR).parent / "runs-rx")
    assert not Path(first.checkpoint_dir).is_relative_to(settings.DATA_DIR)
    assert summary["step"] == 60 and summary["last_checkpoint_step"] == 60
    assert summary["last_loss"] < summary["first_loss"] - 0.5
    checkpoints = sorted(p.name for p in Path(first.checkpoint_dir).iterdir())
    assert checkpoints[-1] == "step-000060"
    assert all((Path(first.checkpoint_dir) / c / "COMPLETE").exists() for c in checkpoints)
    assert "step 60/60" in output(first)

    # SIGUSR1 to the job's steps, as sbatch --signal=USR1@<lead> sends it ahead of a time
    # limit: torchrun hands it to the ranks, they checkpoint the step they are at, and the
    # batch script requeues the job, which resumes from that step.
    job_id = launch(user_api, "llama-pretrain", steps=60, checkpoint_interval=10)
    poll(cluster, job_id, lambda j: j.metrics.get("step", 0) >= 5)
    slurm = get_provider(cluster.provider).slurm(cluster)
    slurm.run(["scancel", "--signal=USR1", job_id])
    second = finished(cluster, job_id)
    events = [json.loads(x) for x in (Path(second.checkpoint_dir).parent / "metrics.jsonl")
              .read_text().splitlines() if '"event"' in x]  # fmt: skip
    stopped = next(e for e in events if e["event"] == "stopped")
    at = stopped["step"]
    assert stopped["reason"] == "signal" and 5 <= at < 60, stopped
    assert second.metrics["resumed_from_step"] == at and second.requeue_count >= 1
    assert any(e["event"] == "checkpoint" and e["step"] == at for e in events)
    out = "".join(
        p.read_text()
        for p in Path(second.checkpoint_dir).parents[2].glob(f"output/slurm-{job_id}.out")
    )
    assert "requeueing job" in out and "restart 1" in out
    seen = set(JobEvent.objects.filter(job=second).values_list("state", flat=True))
    assert not seen & {"FAILED", "CANCELLED"}, seen  # never shown ended on the way
    for step in range(at + 1, min(at + 4, 61)):  # the uninterrupted run's next losses
        assert loss_at(second, step) == pytest.approx(loss_at(first, step), rel=1e-5), step
    assert loss_at(second, 60) == pytest.approx(loss_at(first, 60), rel=1e-5)
    curve = user_api.get(f"/api/v1/clusters/rx/jobs/{job_id}/metrics").json()
    assert [p["step"] for p in curve["series"]] == list(range(1, 61))

    cont = finished(
        cluster, launch(user_api, "continued-pretrain", steps=10, init_from=first.checkpoint_dir)
    )
    assert cont.metrics["first_loss"] < first.metrics["first_loss"] - 0.5


def owned_by_its_user(job: Job) -> None:
    """The run dir and every file the job wrote are its owner's account's, 0700 at top."""
    uid = PosixAccount.objects.get(user=job.owner).uid
    run_dir = Path(job.checkpoint_dir).parent
    assert uid != 0 and run_dir.stat().st_uid == uid and run_dir.stat().st_mode & 0o777 == 0o700
    written = [p for p in run_dir.rglob("*")]
    assert written and {p.stat().st_uid for p in written} == {uid}


def test_gemma_sft_and_rl(cluster, user_api, operator_api):
    gemma = finished(cluster, launch(operator_api, "gemma-pretrain", steps=20, nodes=1))
    assert gemma.metrics["last_loss"] < gemma.metrics["first_loss"]

    sft = finished(cluster, launch(user_api, "sft", steps=80, max_operand=3))
    assert sft.metrics["last_loss"] < sft.metrics["first_loss"]
    # Two users' runs, each their own account's (MTC_IDENTITY=local, the default as root).
    assert gemma.owner != sft.owner
    owned_by_its_user(gemma)
    owned_by_its_user(sft)
    rl = finished(
        cluster, launch(user_api, "rl", steps=40, max_operand=3, init_from=sft.checkpoint_dir)
    )
    rewards = [m.values["reward"] for m in JobMetric.objects.filter(job=rl).order_by("step")]
    assert len(rewards) == 40
    assert sum(rewards[-10:]) / 10 > sum(rewards[:10]) / 10
