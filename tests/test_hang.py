"""Hang detection's parts: the threshold, when a job counts as hung, and which rank the
stacks name (from real faulthandler dumps of node/train/stacks.py)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from clusters.models import Cluster
from jobs.models import Job, JobHang, JobMetric
from node.train.stacks import stacks_path
from recipes.hang import (
    RankStacks,
    hang_due,
    hang_threshold_s,
    hung_rank,
    in_collective,
    recipe_hangs_check,
)
from recipes.memory import signal_lead

from .conftest import make_spec
from .waiting import wait_until

REPO = Path(__file__).resolve().parents[1]


def test_threshold_is_five_median_steps_or_the_floor():
    assert hang_threshold_s([], 60) == 60
    assert hang_threshold_s([0.2] * 40, 60) == 60  # fast steps: the floor
    assert hang_threshold_s([20.0, 30.0, 1000.0], 60) == 150  # the median, not the mean
    assert hang_threshold_s([2.0, None, -1], 5) == 10  # what the run wrote may be junk


def dump_of(tmp_path: Path, rank: int, function: str) -> str:
    """A real dump: a process with the runtime's SIGURG handler, its main thread in
    ``function`` (blocked), signalled as the poller signals a job."""
    program = textwrap.dedent(
        f"""
        import sys, threading, time
        from pathlib import Path
        from node.train.stacks import stacks_install
        keep = stacks_install(Path({str(tmp_path)!r}), {rank})
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        def {function}():
            print("ready", flush=True)
            time.sleep(60)
        {function}()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", program],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "SLURMD_NODENAME": f"n{rank}"},
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        path = stacks_path(tmp_path, rank)
        size = path.stat().st_size
        os.kill(proc.pid, signal.SIGURG)
        wait_until(lambda: path.stat().st_size > size, what="the dump", timeout=10)
        text = path.read_text()
    finally:
        proc.kill()
        proc.wait()
    assert text.startswith(f"# mtc stacks: rank {rank} node n{rank} pid {proc.pid}")
    return text.split("\n", 1)[1]


def test_real_dumps_tell_a_rank_in_a_collective_from_one_outside(tmp_path):
    waiting = dump_of(tmp_path, 0, "all_reduce")
    computing = dump_of(tmp_path, 1, "prepare")
    assert "in all_reduce" in waiting and "in prepare" in computing
    assert in_collective(waiting) and not in_collective(computing)
    ranks = [
        RankStacks(rank=0, node="n0", fresh=True, text=waiting),
        RankStacks(rank=1, node="n1", fresh=True, text=computing),
    ]
    assert hung_rank(ranks) == (1, "the only rank not inside a collective")


def test_the_one_silent_rank_is_named_and_ambiguity_names_none():
    waiting = 'Thread 0x1 (most recent call first):\n  File "/torch/distributed/c.py", line 3 in x'
    fresh = [RankStacks(rank=r, node=f"n{r}", fresh=True, text=waiting) for r in range(4)]
    stopped = RankStacks(rank=2, node="n2", fresh=False, text="")
    assert hung_rank([*fresh[:2], stopped, fresh[3]])[0] == 2
    two_silent = [fresh[0], stopped, RankStacks(rank=3, node="n3", fresh=False, text="")]
    assert hung_rank(two_silent) == (None, "ranks 2, 3 wrote no stacks")
    assert hung_rank(fresh) == (None, "every rank waits in a collective")
    assert hung_rank(fresh[:1])[0] is None  # one rank has no peers to wait for


@pytest.fixture
def running_job(db, tmp_path, settings) -> Job:
    settings.MTC_HANG_FLOOR_S = 60
    cluster = Cluster.objects.create(cluster_id="hu", spec=make_spec("hu"), state="RUNNING")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    return Job.objects.create(
        cluster=cluster,
        job_id="7",
        job_number=7,
        name="r",
        state="RUNNING",
        recipe="llama-pretrain",
        checkpoint_dir=str(tmp_path / "checkpoints"),
        start_time=timezone.now() - timedelta(minutes=30),
    )


def steps(job: Job, last_at, step_time: float, count: int = 10) -> None:
    JobMetric.objects.bulk_create(
        JobMetric(
            job=job,
            step=s,
            time=last_at - timedelta(seconds=step_time * (count - s)),
            values={"step_time_s": step_time},
        )
        for s in range(1, count + 1)
    )
    stamp = last_at.timestamp()
    os.utime(Path(job.checkpoint_dir).parent / "metrics.jsonl", (stamp, stamp))


def test_a_job_is_hung_only_past_its_threshold_and_after_a_step_of_this_attempt(running_job):
    now = timezone.now()
    steps(running_job, now - timedelta(seconds=59), step_time=0.5)
    assert hang_due(running_job, now=now) is None  # under the 60 s floor
    assert hang_due(running_job, now=now + timedelta(seconds=2)) is not None

    JobMetric.objects.filter(job=running_job).delete()
    steps(running_job, now - timedelta(seconds=100), step_time=30)  # 5 x 30 s = 150 s
    assert hang_due(running_job, now=now) is None
    last, since, threshold = hang_due(running_job, now=now + timedelta(seconds=51))
    assert (last.step, threshold) == (10, 150)

    # A requeued job in its setup (no step since it started again) is not hung.
    running_job.start_time = now - timedelta(seconds=50)
    assert hang_due(running_job, now=now + timedelta(hours=1)) is None


def test_progress_in_the_file_counts_and_a_handled_hang_is_not_found_again(running_job):
    now = timezone.now()
    steps(running_job, now - timedelta(seconds=300), step_time=1)
    metrics = Path(running_job.checkpoint_dir).parent / "metrics.jsonl"
    os.utime(metrics, (now.timestamp() - 10, now.timestamp() - 10))  # a checkpoint line
    assert hang_due(running_job, now=now) is None
    os.utime(metrics, (now.timestamp() - 300, now.timestamp() - 300))
    last, since, _ = hang_due(running_job, now=now)
    JobHang.objects.create(
        job=running_job, attempt=0, step=last.step, since=since, detected_time=now, threshold_s=60
    )
    assert hang_due(running_job, now=now + timedelta(minutes=5)) is None


def test_signal_and_exclude_take_only_whole_ids_names_and_signals(tmp_path):
    from slurm import SlurmError
    from slurm.client import SlurmClient

    client = SlurmClient(tmp_path / "slurm.conf")
    for call in (
        lambda: client.job_signal("1;true", "23"),
        lambda: client.job_signal("12", "URG --full"),
        lambda: client.job_signal("12", "-9"),
        lambda: client.job_exclude("12 ", ["n1"]),
        lambda: client.job_exclude("12", ["n1,n2"]),
        lambda: client.job_exclude("12", ["../n1"]),
    ):
        with pytest.raises(SlurmError) as refused:
            call()
        assert refused.value.permanent


def test_an_announced_synchronous_save_gets_the_stop_signals_lead(running_job):
    """No line comes while the last checkpoint is written: a save announced in
    metrics.jsonl is judged against the time Slurm's stop signal gives a save."""
    now = timezone.now()
    steps(running_job, now - timedelta(seconds=120), step_time=1)
    run_dir = Path(running_job.checkpoint_dir).parent
    (run_dir / "run.json").write_text(json.dumps({"model": "llama3-8b", "family": "llama"}))
    metrics = run_dir / "metrics.jsonl"
    with metrics.open("a") as fh:
        fh.write(json.dumps({"event": "checkpoint_saving", "step": 10}) + "\n")
    stamp = (now - timedelta(seconds=120)).timestamp()
    os.utime(metrics, (stamp, stamp))
    lead = signal_lead(family="llama", model="llama3-8b", nodes=1)
    assert lead >= 300
    assert hang_due(running_job, now=now) is None  # 120 s into an 8B save: not hung
    last, since, threshold = hang_due(running_job, now=now + timedelta(seconds=lead))
    assert threshold == lead
    # A line after the save ends the allowance.
    with metrics.open("a") as fh:
        fh.write(json.dumps({"event": "checkpoint", "step": 10}) + "\n")
    os.utime(metrics, (stamp, stamp))
    assert hang_due(running_job, now=now)[2] == 60  # the floor again


def test_a_job_about_to_hang_is_judged_at_its_threshold_not_a_round_later(running_job):
    """The round sees the threshold coming within its look-ahead and asks for a check at
    that moment; a job judged now, or far from it, is not passed on."""
    now = timezone.now()
    steps(running_job, now - timedelta(seconds=58), step_time=0.5)
    asked: list = []
    at = lambda pk, when: asked.append((pk, when))  # noqa: E731
    assert recipe_hangs_check(running_job.cluster, check_at=at, lookahead_s=1) == 0
    assert asked == []  # 2 s from its threshold: the next round comes first
    assert recipe_hangs_check(running_job.cluster, check_at=at, lookahead_s=4) == 0
    [(pk, when)] = asked
    assert pk == running_job.pk
    assert abs((when - (now + timedelta(seconds=2))).total_seconds()) < 0.01
    assert hang_due(running_job, now=when - timedelta(milliseconds=10)) is None
    assert hang_due(running_job, now=when) is not None


def test_a_timed_check_that_starts_early_waits_for_the_threshold(running_job, monkeypatch):
    import recipes.hang
    import recipes.tasks

    handled: list = []
    monkeypatch.setattr(
        recipes.hang, "hang_handle", lambda job, due: handled.append((timezone.now(), due))
    )
    now = timezone.now()
    steps(running_job, now - timedelta(seconds=30), step_time=0.5)
    assert recipes.tasks.recipe_hang_check(running_job.pk) is False  # 30 s to go: no hang
    assert handled == []

    JobMetric.objects.filter(job=running_job).delete()
    steps(running_job, now - timedelta(seconds=59.7), step_time=0.5)
    recipes.tasks.recipe_hang_check(running_job.pk)
    [(when, (last, since, threshold))] = handled
    assert (last.step, threshold) == (10, 60)
    assert when >= since + timedelta(seconds=60)  # waited the last 0.3 s, then judged


def test_a_failed_squeue_is_not_read_as_a_node_without_jobs(tmp_path, monkeypatch):
    """The hang's node is marked (and rebooted by its repair) once the job has left it:
    a squeue that could not answer must not say it has."""
    from slurm import SlurmError
    from slurm.client import SlurmClient

    squeue = tmp_path / "bin" / "squeue"
    squeue.parent.mkdir()
    squeue.write_text(
        "#!/bin/sh\necho 'squeue: error: Unable to contact slurm controller' >&2\nexit 1\n"
    )
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{squeue.parent}:{os.environ['PATH']}")
    with pytest.raises(SlurmError, match="Unable to contact"):
        SlurmClient(tmp_path / "slurm.conf").node_jobs("hx-gpu-1")
