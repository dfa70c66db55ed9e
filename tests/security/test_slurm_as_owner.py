"""Slurm judges every submit as its owner's and keeps users' jobs from each other
(real Slurm, real accounts): on each path mtc submits by (slurmrestd; sbatch for
#SBATCH directives, for a --mem=0 recipe and when slurmrestd is down), a privileged
option is answered exactly as the owner's own sbatch answers it; and from a job,
squeue, scontrol and sacct -a show none of another user's jobs (PrivateData)."""

from __future__ import annotations

import re
import subprocess

import pytest
from django.conf import settings as django_settings

from clusters import services as cluster_services
from clusters.models import Cluster
from clusters.providers import get_provider
from identity.runas import run_as
from identity.services import account_ensure

from ..conftest import cluster_root, make_spec
from ..waiting import job_wait_state

pytestmark = [pytest.mark.slurm, pytest.mark.security]
JOBS = "/api/v1/clusters/own/jobs"
ASKED_PRIORITY = "4000000"


@pytest.fixture
def cluster(local_clusters, settings):
    settings.MTC_IDENTITY = "local"
    cluster_services.cluster_create(spec=make_spec("own", nodes=1))
    return Cluster.objects.get(cluster_id="own")


def slurm_env() -> dict[str, str]:
    conf = cluster_root("own") / "etc" / "slurm.conf"
    return {"PATH": "/usr/bin:/bin", "SLURM_CONF": str(conf), "LANG": "C"}


def scontrol(*args: str) -> str:
    return subprocess.run(
        ["scontrol", *args], env=slurm_env(), capture_output=True, text=True, check=True
    ).stdout


def own_sbatch(account, options: list[str]) -> tuple[bool, str]:
    """The owner's own sbatch (as their account, in their folder): (accepted, answer)."""
    home = cluster_root("own") / "users" / account.name / "work"
    done = run_as(
        account,
        ["sbatch", "--parsable", *options, "--wrap", "true"],
        env=slurm_env(),
        cwd=str(home),
        capture_output=True,
        text=True,
        timeout=30,
    )
    answer = (done.stdout if done.returncode == 0 else done.stderr).strip()
    return done.returncode == 0, re.sub(r"^sbatch: error: ", "", answer.splitlines()[-1])


def job_fields(job_id: str) -> dict[str, str]:
    shown = scontrol("show", "job", "--oneliner", job_id)
    fields = dict(re.findall(r"(\w+)=(\S*)", shown))
    fields["UserId"] = fields.get("UserId", "").split("(")[0]
    return fields


def judged_alike(mine: tuple[bool, str], theirs: tuple[bool, str]) -> None:
    """mtc's answer (accepted, job id or Slurm's refusal) against the owner's own."""
    assert mine[0] == theirs[0], (mine, theirs)
    if not mine[0]:
        assert theirs[1] in mine[1], (mine, theirs)  # the same refusal, in mtc's words
        return
    ours, own = job_fields(mine[1]), job_fields(theirs[1])
    # Each job's own place in the queue differs; whether the asked priority took does not.
    assert (ours["Priority"] == ASKED_PRIORITY) == (own["Priority"] == ASKED_PRIORITY)
    for field in ("Nice", "Partition", "Reservation", "UserId"):
        assert ours.get(field) == own.get(field), field


def mtc_submit(api, script: str, **fields) -> tuple[bool, str]:
    body = {"name": "probe", "script": script, **fields}
    response = api.post(JOBS, body, format="json")
    if response.status_code == 201:
        return True, response.json()["job_id"]
    assert response.status_code == 400, response.content
    return False, response.json()["error"]["message"]


def test_privileged_options_are_judged_as_the_owners_own_on_every_path(cluster, user, user_api):
    account = account_ensure(user=user)
    assert user_api.post(JOBS, {"name": "first", "script": "#!/bin/bash\ntrue\n"}).status_code
    scontrol("create", "PartitionName=adm", "Nodes=ALL", "RootOnly=YES")
    scontrol(
        "create", "ReservationName=ops", "Users=root", "StartTime=now+1hour",
        "Duration=60", "Nodes=ALL",
    )  # fmt: skip
    # Directives: sbatch, as the owner. (Held back an hour: a pending job shows the
    # priority Slurm gave it.)
    for option in (
        f"--priority={ASKED_PRIORITY}",
        "--nice=-50000",
        "--partition=adm",
        "--reservation=ops",
    ):
        options = [option, "--begin=now+1hour"]
        script = "#!/bin/bash\n" + "".join(f"#SBATCH {o}\n" for o in options) + "true\n"
        judged_alike(mtc_submit(user_api, script), own_sbatch(account, options))
    # slurmrestd (no directive) and sbatch once slurmrestd is down: the spec's own
    # partition made root-only meanwhile.
    scontrol("update", "PartitionName=gpu", "RootOnly=YES")
    theirs = own_sbatch(account, ["--partition=gpu"])
    assert not theirs[0]
    provider = get_provider("local")
    assert provider._slurmrestd_pid(cluster), "slurmrestd answers (the REST path)"
    judged_alike(mtc_submit(user_api, "#!/bin/bash\ntrue\n", partition="gpu"), theirs)
    launch = user_api.post(
        "/api/v1/clusters/own/recipes/llama-pretrain/launch",
        {"nodes": 1, "partition": "gpu", "gpus_per_node": 8, "overrides": {"steps": 2}},
        format="json",
    )  # a GPU recipe asks --mem=0: no REST mapping, so sbatch
    assert launch.status_code == 400 and theirs[1] in launch.json()["error"]["message"]
    provider._stop_slurmrestd(cluster)
    judged_alike(mtc_submit(user_api, "#!/bin/bash\ntrue\n", partition="gpu"), theirs)


def test_a_job_sees_none_of_another_users_jobs_through_slurm(cluster, user, user_api, operator_api):
    theirs = operator_api.post(
        JOBS, {"name": "their-secret-run", "script": "#!/bin/bash\nsleep 120\n"}, format="json"
    ).json()["job_id"]
    job_wait_state(cluster, theirs, {"RUNNING"}, timeout=60)
    accounting = bool(django_settings.MTC_SLURMDBD_PORT)
    script = (
        "#!/bin/bash\n"
        "echo SQUEUE; squeue -h -o '%i %u %j'\n"
        f"echo SCONTROL; scontrol show job {theirs} 2>&1\n"
        + (
            "echo SACCT; sacct -a -n -X -o jobid,user,jobname -S now-1hour 2>&1\n"
            if accounting
            else ""
        )
    )
    mine = user_api.post(JOBS, {"name": "snoop", "script": script}, format="json").json()
    job_wait_state(cluster, mine["job_id"], {"COMPLETED", "FAILED"}, timeout=90)
    seen = user_api.get(f"{JOBS}/{mine['job_id']}/output?stream=stdout").json()["data"]
    assert "SQUEUE" in seen and "SCONTROL" in seen, seen
    assert "their-secret-run" not in seen and f"JobId={theirs}" not in seen, seen
    assert not re.search(rf"^{theirs}\b", seen, re.M), seen
    assert operator_api.get(f"{JOBS}/{theirs}").status_code == 200  # mtc itself sees all
    operator_api.post(f"{JOBS}/{theirs}/cancel")
