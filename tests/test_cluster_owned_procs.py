"""Deleting a local cluster ends its daemons and its jobs' processes (also one no
slurmstepd leads to any more), and nothing else: another user's shell whose environment
has the cluster's SLURM_CONF keeps running."""

import os
import signal
import subprocess

import pytest

from clusters.providers import procs

from .conftest import cluster_root, make_spec
from .unix import spare_uids
from .waiting import wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture
def other_user():
    """A temporary Unix account of its own."""
    if os.geteuid() != 0:
        pytest.skip("useradd needs root")
    uid = spare_uids()
    name = f"mtcown{uid}"
    subprocess.run(
        ["useradd", "--uid", str(uid), "--no-create-home", "--shell", "/bin/sh", name], check=True
    )
    yield name, uid
    subprocess.run(["userdel", name], check=False)


def _poll(condition, what: str, timeout: float = 60):
    wait_until(condition, what=what, timeout=timeout, every=0.1)


def _job_task_pids(job_id: str) -> list[int]:
    """Processes that run the job's script (the batch step's task, by its env)."""
    needle = f"SLURM_JOB_ID={job_id}\0".encode()
    return [
        int(e)
        for e in os.listdir("/proc")
        if e.isdigit() and needle in procs._read(f"/proc/{e}/environ")
    ]


def test_delete_ends_only_what_the_cluster_owns(local_clusters, operator_api, other_user):
    name, uid = other_user
    response = operator_api.post("/api/v1/clusters", make_spec("own1", nodes=1), format="json")
    assert response.status_code == 202, response.content
    op = operator_api.get(f"/api/v1/operations/{response.json()['id']}").json()
    assert op["state"] == "SUCCEEDED", op

    root = cluster_root("own1")
    conf = root / "etc" / "slurm.conf"
    job = operator_api.post(
        "/api/v1/clusters/own1/jobs",
        {"name": "long", "nodes": 1, "script": "#!/bin/bash\nsleep 600\n"},
        format="json",
    )
    assert job.status_code == 201, job.content
    job_id = job.json()["job_id"]
    _poll(lambda: _job_task_pids(job_id), "the job's script to run")
    job_pids = _job_task_pids(job_id)
    # The fabric fault's throttle outlives reboots, not the cluster.
    fault = operator_api.post(
        "/api/v1/clusters/own1/nodes/own1-gpu-0/faults", {"kind": "fabric"}, format="json"
    )
    assert fault.status_code == 202, fault.content
    throttle = procs.pid_from_file(root / "run" / "throttle-fabric-own1-gpu-0.pid")
    assert throttle and procs.is_running(throttle)

    # Another user's shell: SLURM_CONF in its environment, the cluster dir on its command line.
    shell = subprocess.Popen(
        ["env", f"SLURM_CONF={conf}", "sh", "-c", "sleep 600; :", str(root)],
        user=uid,
        group=uid,
        extra_groups=[],
        start_new_session=True,
    )
    # A job process no slurmstepd leads to (its step went first): in its own session.
    orphan = subprocess.Popen(
        ["env", f"SLURM_CONF={conf}", f"SLURM_JOB_ID={job_id}", "sleep", "600"],
        start_new_session=True,
    )
    try:
        _poll(lambda: b"sleep 600; :" in procs._read(f"/proc/{shell.pid}/cmdline"), "the shell")
        _poll(lambda: b"SLURM_JOB_ID" in procs._read(f"/proc/{orphan.pid}/environ"), "the orphan")
        daemons = [
            procs.pid_from_file(root / "run" / f)
            for f in ("slurmctld.pid", "munged.pid", "slurmd-own1-gpu-0.pid")
        ]
        assert all(pid and procs.is_running(pid) for pid in daemons), daemons

        response = operator_api.delete("/api/v1/clusters/own1")
        assert response.status_code == 202
        op = operator_api.get(f"/api/v1/operations/{response.json()['id']}").json()
        assert op["state"] == "SUCCEEDED", op

        assert operator_api.get("/api/v1/clusters/own1").status_code == 404
        assert not root.exists()
        assert [p for p in daemons if procs.is_running(p)] == []
        assert [p for p in job_pids if procs.is_running(p)] == []
        assert not procs.is_running(throttle)
        assert orphan.wait(timeout=10) is not None  # ended with the cluster
        assert _job_task_pids(job_id) == []
        assert shell.poll() is None and procs.is_running(shell.pid)  # the user's shell lives
        assert shell.pid in procs.processes_mentioning(str(root))
    finally:
        os.killpg(shell.pid, signal.SIGKILL)  # the shell and its sleep
        shell.wait()
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()
