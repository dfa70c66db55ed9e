"""Jobs run as their owner's own Unix account (MTC_IDENTITY=local) on a real local
cluster: the job sees its own uid, owns its files, and cannot read mtc's secrets or
touch another user's job."""

from __future__ import annotations

import os

import pytest
from django.conf import settings as django_settings

from clusters import services as cluster_services
from clusters.models import Cluster
from identity.models import PosixAccount
from identity.services import account_ensure
from mtc import userfs

from ..conftest import cluster_processes, cluster_root, make_spec
from ..unix import give
from ..waiting import job_wait_state

pytestmark = pytest.mark.slurm


CANARIES = {"MTC_ADMIN_PASSWORD": "pw-admin-canary", "DATABASE_URL": "postgres://m:db-canary@h/m"}


@pytest.fixture
def secret_env(monkeypatch):
    """mtc's environment holds secrets while it starts the cluster's daemons."""
    for key, value in CANARIES.items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def cluster(secret_env, local_clusters, settings):
    settings.MTC_IDENTITY = "local"
    cluster_services.cluster_create(spec=make_spec("idn", nodes=2))
    return Cluster.objects.get(cluster_id="idn")


wait_state = job_wait_state


def submit(api, script: str, name: str) -> dict:
    response = api.post(
        "/api/v1/clusters/idn/jobs", {"name": name, "script": script}, format="json"
    )
    assert response.status_code == 201, response.content
    return response.json()


def output(api, job_id: str, stream: str) -> str:
    response = api.get(f"/api/v1/clusters/idn/jobs/{job_id}/output?stream={stream}")
    assert response.status_code == 200, response.content
    return response.json()["data"]


def test_a_users_job_runs_as_their_account_and_cannot_reach_mtcs_secrets(cluster, user_api, user):
    data = django_settings.DATA_DIR
    token = next((cluster_root("idn") / "nodes").glob("*/agent.token"), None) or (
        cluster_root("idn") / "nodes" / "idn-gpu-0" / "agent.token"
    )
    secrets = [data / "test.sqlite3", data / "secret_key", token]
    script = "#!/bin/bash\nid -u\n" + "".join(f"cat {path} >/dev/null\n" for path in secrets)
    job = submit(user_api, script, "whoami")
    done = wait_state(cluster, job["job_id"], {"COMPLETED", "FAILED"})
    account = PosixAccount.objects.get(user=user)
    assert account.uid != 0
    assert output(user_api, job["job_id"], "stdout").split()[0] == str(account.uid)
    assert done.user == account.name
    errors = output(user_api, job["job_id"], "stderr")
    for path in secrets:
        assert f"cat: {path}: Permission denied" in errors, errors
    # Its output file is the owner's.
    outputs = list((cluster_root("idn") / "users" / account.name / "output").iterdir())
    assert outputs and all(os.stat(p).st_uid == account.uid for p in outputs)


def test_a_job_cannot_cancel_another_users_job(cluster, user_api, operator_api):
    victim = submit(operator_api, "#!/bin/bash\nsleep 120\n", "victim")
    wait_state(cluster, victim["job_id"], {"RUNNING"})
    attacker = submit(user_api, f"#!/bin/bash\nscancel {victim['job_id']}\necho rc=$?\n", "x")
    wait_state(cluster, attacker["job_id"], {"COMPLETED", "FAILED"})
    assert "rc=0" not in output(user_api, attacker["job_id"], "stdout")
    assert wait_state(cluster, victim["job_id"], {"RUNNING"}).state == "RUNNING"


def test_another_users_output_and_checkpoints_are_out_of_reach(
    cluster, user_api, operator_api, operator
):
    theirs = submit(operator_api, "#!/bin/bash\necho private-result\n", "theirs")
    wait_state(cluster, theirs["job_id"], {"COMPLETED"})
    other = account_ensure(user=operator)
    their_root = cluster_root("idn") / "users" / other.name
    checkpoint = their_root / "runs" / "r1" / "checkpoints" / "step-000001"
    for path in (their_root / "runs", checkpoint.parent.parent, checkpoint.parent, checkpoint):
        userfs.dir_own(path, other)
    (checkpoint / ".metadata").write_bytes(b"weights")
    give(checkpoint, other)
    their_output = next((their_root / "output").iterdir())
    targets = [their_output, checkpoint / ".metadata", their_root / "runs"]
    script = "#!/bin/bash\n" + "".join(f"cat {path}\n" for path in targets[:2])
    script += f"ls {targets[2]}\n"
    job = submit(user_api, script, "snoop")
    wait_state(cluster, job["job_id"], {"COMPLETED", "FAILED"})
    assert "private-result" not in output(user_api, job["job_id"], "stdout")
    errors = output(user_api, job["job_id"], "stderr")
    for path in targets:
        denied = [line for line in errors.splitlines() if str(path) in line]
        assert denied and denied[0].endswith("Permission denied"), errors


def test_the_daemons_environment_holds_none_of_mtcs_secrets(cluster):
    daemons = [
        pid
        for pid in cluster_processes("idn")
        if open(f"/proc/{pid}/comm").read().strip() in ("slurmctld", "slurmd", "slurmrestd")
    ]
    assert {open(f"/proc/{pid}/comm").read().strip() for pid in daemons} >= {"slurmctld", "slurmd"}
    for pid in daemons:
        environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        names = {item.split(b"=", 1)[0].decode() for item in environ if item}
        assert not {n for n in names if n.startswith("MTC_") or n == "DATABASE_URL"}, names
        for value in CANARIES.values():
            assert value.encode() not in b"\0".join(environ)
