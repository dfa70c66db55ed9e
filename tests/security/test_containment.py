"""Jobs contained on local clusters (proctrack/cgroup, task/cgroup over cgroup v1): a
process a job leaves behind (setsid) is gone when the job ends, and a job over its
memory is stopped by the cgroup; --mem=0 still gets the node (RealMemory declared)."""

from __future__ import annotations

import os
import signal

import pytest

from clusters import services as cluster_services
from clusters.models import Cluster
from clusters.providers.cgroups import cgroups_problem

from ..conftest import cluster_root, make_spec
from ..waiting import job_wait_state, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.security]
JOBS = "/api/v1/clusters/box/jobs"


@pytest.fixture
def cluster(local_clusters, settings):
    if why := cgroups_problem():  # make run says so too; clusters then run without
        pytest.skip(f"this host gives local clusters no cgroups: {why}")
    settings.MTC_IDENTITY = "local"
    cluster_services.cluster_create(spec=make_spec("box", nodes=1))
    return Cluster.objects.get(cluster_id="box")


def processes_named(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = open(f"/proc/{entry}/cmdline", "rb").read()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry))
    return found


def test_a_process_left_behind_is_gone_when_the_job_ends(cluster, user_api):
    marker = f"mtc-left-behind-{os.getpid()}"
    script = f"#!/bin/bash\nsetsid bash -c 'exec -a {marker} sleep 300' &\nsleep 2\necho started\n"
    job = user_api.post(JOBS, {"name": "leave", "script": script}, format="json").json()
    try:
        job_wait_state(cluster, job["job_id"], {"COMPLETED"}, timeout=90)
        wait_until(lambda: not processes_named(marker), what="the left process to be gone")
    finally:
        for pid in processes_named(marker):
            os.kill(pid, signal.SIGKILL)


def test_a_job_over_its_memory_is_stopped_and_mem_0_gets_the_node(cluster, user_api):
    hog = (
        "#!/bin/bash\n#SBATCH --mem=100M\n"
        "/usr/bin/python3 -c \"b = bytearray(400 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
        "print('held 400 MB')\"\n"
    )
    job = user_api.post(JOBS, {"name": "hog", "script": hog}, format="json").json()
    done = job_wait_state(
        cluster, job["job_id"], {"OUT_OF_MEMORY", "FAILED", "COMPLETED"}, timeout=90
    )
    out = user_api.get(f"{JOBS}/{job['job_id']}/output?stream=stdout").json()["data"]
    assert done.state in ("OUT_OF_MEMORY", "FAILED") and "held 400 MB" not in out, (done.state, out)
    whole = "#!/bin/bash\n#SBATCH --mem=0\necho whole node\n"
    job = user_api.post(JOBS, {"name": "whole", "script": whole}, format="json").json()
    done = job_wait_state(cluster, job["job_id"], {"COMPLETED", "FAILED"}, timeout=90)
    assert done.state == "COMPLETED"


def test_a_job_has_its_own_cores_and_gpu_devices_only(cluster, user_api):
    dev = cluster_root("box") / "nodes" / "box-gpu-0" / "dev"
    script = (
        "#!/bin/bash\n"
        "echo cores=$(nproc)\n"
        f'for n in 0 1; do cat {dev}/nvidia$n 2>&1 | sed "s/^/gpu$n: /"; done\n'
    )
    body = {"name": "gpus", "script": script, "gpus_per_node": 1, "cpus_per_task": 1}
    job = user_api.post(JOBS, body, format="json").json()
    job_wait_state(cluster, job["job_id"], {"COMPLETED", "FAILED"}, timeout=90)
    out = user_api.get(f"{JOBS}/{job['job_id']}/output?stream=stdout").json()["data"]
    assert "cores=1" in out, out  # the host has more; the job's cpuset has one
    granted = [line for line in out.splitlines() if "No such device or address" in line]
    refused = [line for line in out.splitlines() if "Operation not permitted" in line]
    assert len(granted) == 1 and len(refused) == 1, out  # its GPU opens (no driver); not the other
