"""Straggler detection: the window/ratio logic, the runtime's per-rank step-time files,
the `straggle` fault's choice of processes, and end to end on real Slurm: a 2-node llama
job on a 3-node pool, one of its nodes throttled, requeued without it and completed."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.agent.throttle import node_pids
from node.train.steptimes import StepTimes
from recipes.straggler import RATIO, WINDOW_STEPS, WINDOWS, straggler_find

from .waiting import wait_until

STEPS = WINDOW_STEPS * WINDOWS


def rows(compute: dict[int, list[float]], nodes=None, first: int = 1) -> list[dict]:
    """Step-time lines: ``compute[rank]`` per step from ``first``."""
    out = []
    for rank, times in compute.items():
        for i, value in enumerate(times):
            node = (nodes or {}).get(rank, f"n-{rank}")
            out.append({"step": first + i, "rank": rank, "node": node, "compute_s": value})
    return out


def test_a_rank_slow_in_k_windows_in_a_row_is_the_straggler():
    found = straggler_find(
        rows({0: [0.10] * STEPS, 1: [0.20] * STEPS, 2: [0.11] * STEPS}, {1: "gpu-7"})
    )
    assert found is not None
    assert (found.rank, found.node, found.ratio) == (1, "gpu-7", pytest.approx(0.2 / 0.11, 0.01))
    assert (found.first_step, found.last_step) == (1, STEPS)
    assert "rank 1 on gpu-7: compute 1.82x the job's median" in found.evidence()


def test_with_two_ranks_the_slow_one_must_be_well_over_the_other():
    # The median of two is their mean: 1.5x the other is only 1.2x the median.
    assert straggler_find(rows({0: [0.10] * STEPS, 1: [0.15] * STEPS})) is None
    found = straggler_find(rows({0: [0.10] * STEPS, 1: [0.18] * STEPS}))
    assert found is not None and found.ratio >= RATIO


def test_noise_is_not_a_straggler():
    w = WINDOW_STEPS
    # Slow in every window but one of the last K: not K in a row.
    bursty = [0.2] * w + [0.1] * w + [0.2] * w * (WINDOWS - 1)
    assert straggler_find(rows({0: [0.1] * len(bursty), 1: bursty})) is None
    # Every window has a slow rank, but a different one each time.
    alternating = {0: [], 1: []}
    for window in range(WINDOWS):
        alternating[window % 2] += [0.2] * w
        alternating[1 - window % 2] += [0.1] * w
    assert straggler_find(rows(alternating)) is None
    # One step far out (a neighbour's burst) is diluted by its window.
    spike = [0.1] * STEPS
    spike[2] = 0.3
    assert straggler_find(rows({0: [0.1] * STEPS, 1: spike})) is None


def test_only_complete_consecutive_windows_count():
    slow, fast = [0.2] * STEPS, [0.1] * STEPS
    assert straggler_find(rows({0: fast, 1: slow})) is not None
    # The other rank has not reported the last step yet: one window short.
    assert straggler_find(rows({0: fast[:-1], 1: slow})) is None
    assert straggler_find(rows({0: fast, 1: slow}, first=WINDOW_STEPS + 1)) is not None
    # A gap (a window no rank reported): the windows are not in a row.
    gapped = [r for r in rows({0: fast, 1: slow}) if r["step"] != WINDOW_STEPS + 1]
    assert straggler_find(gapped) is None
    # Only the last K windows: a rank that was slow before and is not now is not.
    recovered = straggler_find(rows({0: fast + fast, 1: slow + fast}))
    assert recovered is None
    assert straggler_find(rows({0: [0.1] * STEPS})) is None  # one rank: nothing to compare


def test_the_runtime_writes_one_line_per_step_per_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "rx-gpu-1")
    timer = StepTimes(tmp_path, rank=1, world=2)
    try:
        for step in (1, 2):
            with timer.comm():
                time.perf_counter()
            timer.step_end(step, 0.5)
    finally:
        timer.close()
    lines = [
        json.loads(x) for x in (tmp_path / "steptimes" / "rank-1.jsonl").read_text().splitlines()
    ]
    assert [(x["step"], x["rank"], x["node"], x["step_s"]) for x in lines] == [
        (1, 1, "rx-gpu-1", 0.5),
        (2, 1, "rx-gpu-1", 0.5),
    ]
    assert all(0 < x["compute_s"] <= 0.5 and x["comm_s"] >= 0 for x in lines)
    # A new attempt starts its file afresh; one rank alone writes nothing.
    StepTimes(tmp_path, rank=1, world=2).close()
    assert (tmp_path / "steptimes" / "rank-1.jsonl").read_text() == ""
    StepTimes(tmp_path / "solo", rank=0, world=1).close()
    assert not (tmp_path / "solo").exists()


STOP_PROGRAM = """
import os, signal, sys, time
from pathlib import Path
from node.train import train
with train._StopSignals(Path(sys.argv[1])):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    print("stop asked", train._STOP["signum"])
"""


@pytest.mark.parametrize("stop_now", [False, True])
def test_sigterm_skips_the_stop_checkpoint_only_when_mtc_asked(tmp_path, stop_now):
    """The runtime's SIGTERM: a checkpoint at the end of the step (the rank goes on and
    records the ask), or with STOP_NOW_FILE in the run dir (a straggler's requeue) an
    exit at once with 143."""
    from node.train.config import STOP_NOW_FILE

    if stop_now:
        (tmp_path / STOP_NOW_FILE).write_text("straggler\n")
    proc = subprocess.run(
        [sys.executable, "-c", STOP_PROGRAM, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parent.parent,
    )
    if stop_now:
        assert proc.returncode == 143 and "stop asked" not in proc.stdout, proc.stderr
    else:
        assert proc.returncode == 0 and "stop asked 15" in proc.stdout, proc.stderr


def test_straggle_throttles_the_nodes_job_processes_only(tmp_path):
    """`straggle` picks the node's job processes (Slurm's job environment), not its
    agent, slurmd or another node's job; `slow` picks them all."""
    conf = tmp_path / "etc" / "slurm.conf"
    conf.parent.mkdir()
    pidfile = tmp_path / "run" / "slurmd-n1.pid"
    base = {"PATH": os.environ.get("PATH", ""), "SLURM_CONF": str(conf)}
    kinds = {
        "job": {"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "42"},
        "agent": {"MTC_NODE": "n1"},
        "healthcheck": {"SLURMD_NODENAME": "n1"},
        "other-node-job": {"SLURMD_NODENAME": "n2", "SLURM_JOB_ID": "42"},
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"], env={**base, **env}
        )
        for name, env in kinds.items()
    }
    try:
        wait_until(
            lambda: all(
                f"SLURM_CONF={conf}\0".encode() in Path(f"/proc/{p.pid}/environ").read_bytes()
                for p in procs.values()
            ),
            what="the processes started with their environment",
        )
        pid = {name: p.pid for name, p in procs.items()}
        jobs_only = node_pids("n1", str(pidfile), jobs_only=True)
        assert jobs_only & set(pid.values()) == {pid["job"]}
        everything = node_pids("n1", str(pidfile))
        assert everything & set(pid.values()) == {pid["job"], pid["agent"], pid["healthcheck"]}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


# --- end to end on real Slurm -----------------------------------------------------------
@pytest.fixture
def cluster(local_clusters, settings):
    from clusters import services as cluster_services
    from clusters.models import Cluster

    from .conftest import make_spec

    settings.MTC_IDENTITY = "local"
    cluster_services.cluster_create(spec=make_spec("sx", nodes=3))
    return Cluster.objects.get(cluster_id="sx")


@pytest.mark.slurm
def test_a_straggling_node_is_excluded_and_the_job_completes(cluster, user_api, operator_api):
    from clusters.providers import get_provider
    from health.models import NodeFailure
    from jobs.models import Job
    from jobs.services import jobs_release_requeued
    from jobs.sync import jobs_sync
    from recipes.tasks import recipe_round

    response = user_api.post(
        "/api/v1/clusters/sx/recipes/llama-pretrain/launch",
        {"nodes": 2, "overrides": {"steps": 90, "checkpoint_interval": 10}},
        format="json",
    )
    assert response.status_code == 201, response.content
    job_id = response.json()["job_id"]
    client = get_provider("local").slurm(cluster)

    def job() -> Job:
        jobs_sync(cluster=cluster)
        recipe_round(cluster)  # the poller's round: metrics, then stragglers
        jobs_release_requeued(cluster=cluster)
        return Job.objects.get(cluster=cluster, job_id=job_id)

    def hosts(node_list: str) -> list[str]:
        return client.run(["scontrol", "show", "hostnames", node_list]).stdout.split()

    first = wait_until(
        lambda: (j := job()).metrics.get("last_checkpoint_step", 0) >= 10 and j,
        what="a checkpoint at step 10",
        timeout=180,
        every=0.3,
    )
    # No straggler among healthy nodes so far.
    assert not NodeFailure.objects.filter(cluster=cluster, mode="SLOW_NODE").exists()
    victim = hosts(first.node_list)[-1]
    response = operator_api.post(
        f"/api/v1/clusters/sx/nodes/{victim}/faults",
        {"kind": "straggle", "duty": 0.75},
        format="json",
    )
    assert response.status_code == 202 and response.json()["emulated"] is False
    failure = wait_until(
        lambda: job() and NodeFailure.objects.filter(node__name=victim, mode="SLOW_NODE").first(),
        what=lambda: (
            f"SLOW_NODE on {victim}; job is {job().state} at step {job().metrics.get('step')}"
        ),
        timeout=120,
        every=0.3,
    )
    match = re.search(
        rf"rank (\d) on {victim}: compute (\d+\.\d+)x the job's median", failure.message
    )
    assert match, failure.message
    assert float(match.group(2)) >= RATIO
    again = wait_until(
        lambda: (j := job()).state == "RUNNING" and victim not in hosts(j.node_list) and j,
        what=lambda: f"the job running without {victim}; it is {job().state} on {job().node_list}",
        timeout=90,
        every=0.3,
    )
    assert len(hosts(again.node_list)) == 2
    done = wait_until(
        lambda: (j := job()).state in ("COMPLETED", "FAILED", "CANCELLED") and j,
        what=lambda: f"the job to finish; it is {job().state}",
        timeout=240,
        every=0.5,
    )
    assert done.state == "COMPLETED" and done.metrics["step"] == 90
    assert done.metrics["resumed_from_step"] >= 10
    causes = [e.cause for e in done.events.all()]
    assert any(
        c.startswith(f"interrupted: straggler: rank {match.group(1)} on {victim}")
        and f"without {victim}" in c
        for c in causes
    ), causes
    # Acted once: one SLOW_NODE failure, and the node went into its repair ladder.
    assert NodeFailure.objects.filter(node__name=victim, mode="SLOW_NODE").count() == 1
    assert failure.repairs.exists()
