"""A job flips its own output file between a plain file, a link to a root-only file
and a FIFO while its owner reads the output API 2,000 times: nothing foreign comes
back and no read waits (real Slurm, the job as its owner's account)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from clusters import services as cluster_services
from clusters.models import Cluster
from identity.services import account_ensure

from ..conftest import cluster_root, make_spec
from ..waiting import job_wait_state, wait_until
from .conftest import RootOnly

pytestmark = [pytest.mark.slurm, pytest.mark.security]
READS = 2000

FLIP = """#!/bin/bash
o={out}/slurm-$SLURM_JOB_ID.out
end=$((SECONDS + 300))
while [ $SECONDS -lt $end ]; do
  ln -sfn {secret} "$o.l" && mv -fT "$o.l" "$o"
  printf 'mine\\n' > "$o.f" && mv -fT "$o.f" "$o"
  rm -f "$o.p"; mkfifo "$o.p" && mv -fT "$o.p" "$o"
done
"""


@pytest.fixture
def cluster(local_clusters, settings):
    settings.MTC_IDENTITY = "local"
    cluster_services.cluster_create(spec=make_spec("flip", nodes=1))
    return Cluster.objects.get(cluster_id="flip")


def test_reading_output_a_job_flips_between_a_file_a_link_and_a_fifo(
    cluster, user, user_api, settings
):
    secret = RootOnly(Path(settings.DATA_DIR) / "flip-secret")
    out = cluster_root("flip") / "users" / account_ensure(user=user).name / "output"
    script = FLIP.format(out=out, secret=secret.file)
    response = user_api.post(
        "/api/v1/clusters/flip/jobs", {"name": "flip", "script": script}, format="json"
    )
    assert response.status_code == 201, response.content
    job_id = response.json()["job_id"]
    job_wait_state(cluster, job_id, {"RUNNING"}, timeout=60)
    url = f"/api/v1/clusters/flip/jobs/{job_id}/output?stream=stdout"

    def read() -> str:
        answer = user_api.get(url)
        assert answer.status_code == 200, answer.content
        return answer.json()["data"]

    wait_until(lambda: read() == "mine\n", what="the job to be flipping its output")
    seen: dict[str, int] = {}
    slowest = 0.0
    try:
        for _ in range(READS):
            started = time.monotonic()
            data = read()
            slowest = max(slowest, time.monotonic() - started)
            seen[data] = seen.get(data, 0) + 1
    finally:
        user_api.post(f"/api/v1/clusters/flip/jobs/{job_id}/cancel")
    assert set(seen) <= {"", "mine\n"}, seen  # never a byte of the root-only file
    assert seen.get("mine\n"), seen
    assert slowest < 1.0, f"a read took {slowest:.2f} s"
    secret.assert_untouched()
