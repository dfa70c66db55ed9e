"""Usage against real MariaDB + slurmdbd + Slurm: GET /api/v1/usage returns the
GPU-hours that sacct itself reports for the test's jobs (jobs on emulated GPUs)."""

import os
import subprocess
from datetime import UTC, datetime, timedelta

import pytest

from clusters import services as cluster_services
from clusters.models import Cluster
from clusters.providers import get_provider
from jobs.models import Job
from jobs.sync import jobs_sync
from slurm.accounting import parse_size

from .conftest import cluster_root, make_spec
from .waiting import wait_until

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        not os.environ.get("MTC_SLURMDBD_PORT"),
        reason="no slurmdbd (scripts/test.sh starts one; MTC_TEST_ACCOUNTING=0 skips it)",
    ),
]


def slurm(*args: str) -> str:
    conf = cluster_root("us") / "etc" / "slurm.conf"
    return subprocess.run(
        list(args),
        env=dict(os.environ, SLURM_CONF=str(conf)),
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def test_usage_returns_the_gpu_hours_sacct_reports(local_clusters, operator_api):
    spec = make_spec("us", nodes=1)
    spec["orchestrator_spec"]["slurm_spec"]["config_overrides"] = {"MinJobAge": 2}
    cluster_services.cluster_create(spec=spec)
    cluster = Cluster.objects.get(cluster_id="us")
    ids = [
        slurm(
            "sbatch",
            "--parsable",
            "--output=/dev/null",
            f"--gpus-per-node={gpus}",
            "--wrap",
            f"sleep {secs}",
        ).strip()
        for gpus, secs in ((2, 2), (3, 3))
    ]
    jobs_sync(cluster=cluster)  # the poller sees them queued or running
    client = get_provider(cluster.provider).slurm(cluster)
    wait_until(
        lambda: not set(ids) & {q.job_id for q in client.queue()},
        what=lambda: f"jobs {ids} to leave squeue: {client.queue()}",
        timeout=90,
        every=1,
    )
    jobs_sync(cluster=cluster)  # the next round settles them from sacct
    assert Job.objects.filter(job_id__in=ids, settled=True, elapsed_s__gt=0).count() == 2

    # The expected figure from sacct's own output: GPUs in AllocTRES x ElapsedRaw.
    out = slurm(
        "sacct",
        "--parsable2",
        "--noheader",
        "-X",
        "-o",
        "JobID,ElapsedRaw,AllocTRES",
        f"--jobs={','.join(ids)}",
    )
    gpu_seconds, cpu_seconds = 0, 0
    for line in out.splitlines():
        job_id, elapsed, tres = line.split("|")
        assert job_id in ids
        parts = dict(item.split("=", 1) for item in tres.split(","))
        gpu_seconds += int(parts["gres/gpu"]) * int(elapsed)
        cpu_seconds += int(parts["cpu"]) * int(elapsed)
        job = Job.objects.get(cluster=cluster, job_id=job_id)  # what settle stored
        assert (job.cpus_allocated, job.mem_allocated_bytes) == (
            int(parts["cpu"]),
            parse_size(parts["mem"]) if parts.get("mem", "0") != "0" else None,
        ), tres
    assert gpu_seconds >= 2 * 2 + 3 * 3

    today = datetime.now(UTC).date()
    window = {"start": str(today - timedelta(days=1)), "end": str(today + timedelta(days=1))}
    body = operator_api.get(
        "/api/v1/usage", {"cluster": "us", **window, "group_by": "partition"}
    ).json()
    assert body["totals"]["jobs"] == 2
    assert body["totals"]["gpu_hours"] == pytest.approx(gpu_seconds / 3600, abs=1e-6)
    assert body["totals"]["cpu_hours"] == pytest.approx(cpu_seconds / 3600, abs=1e-6)
    # And each job's efficiency carries its own share.
    job = operator_api.get(f"/api/v1/clusters/us/jobs/{ids[1]}").json()
    assert job["gpus_allocated"] == 3 and job["efficiency"]["gpu_hours"] > 0
