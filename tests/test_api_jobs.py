"""The Slurm Job API against a real local cluster (docs/api.md)."""

import os
import subprocess
import time

import pytest
from rest_framework.test import APIClient

from clusters import services as cluster_services
from clusters.models import Cluster
from jobs.models import Job
from jobs.sync import jobs_sync

from .conftest import cluster_root, make_spec
from .waiting import job_wait_state, wait_until

pytestmark = pytest.mark.slurm
NODE_NAMES = "#!/bin/bash\nsrun bash -c 'echo node=$SLURMD_NODENAME'\n"


@pytest.fixture
def cluster(local_clusters):
    cluster_services.cluster_create(spec=make_spec("jb", nodes=2))
    return Cluster.objects.get(cluster_id="jb")


@pytest.fixture
def other_api(django_user_model) -> APIClient:
    client = APIClient()
    client.force_authenticate(django_user_model.objects.create_user("bob", password="pw-bob-1"))
    return client


def squeue_ids(cluster_id: str) -> list[str]:
    conf = cluster_root(cluster_id) / "etc" / "slurm.conf"
    out = subprocess.run(
        ["squeue", "--noheader", "--states=all", "--format=%i"],
        capture_output=True,
        text=True,
        env=dict(os.environ, SLURM_CONF=str(conf)),
        check=True,
    ).stdout
    return out.split()


def wait_state(cluster, job_id: str, states: set[str], timeout: float = 20) -> Job:
    return job_wait_state(cluster, job_id, states, timeout=timeout)


def submit(api, body, cluster_id="jb"):
    return api.post(f"/api/v1/clusters/{cluster_id}/jobs", body, format="json")


def test_two_node_job_completes_with_both_node_names(cluster, user_api):
    response = submit(
        user_api,
        {
            "name": "hello",
            "script": NODE_NAMES,
            "nodes": 2,
            "gpus_per_node": 8,
            "env": {"GREETING": "hi there"},
        },
    )
    assert response.status_code == 201, response.content
    job = response.json()
    assert job["owner"] == "uma" and job["state"] == "PENDING"
    start = time.monotonic()
    done = wait_state(cluster, job["job_id"], {"COMPLETED", "FAILED"})
    assert done.state == "COMPLETED" and done.exit_code == "0:0"
    assert time.monotonic() - start < 10
    assert done.node_list == "jb-gpu-[0-1]" and done.gpus == 16

    out = user_api.get(f"/api/v1/clusters/jb/jobs/{job['job_id']}/output?stream=stdout&offset=0")
    assert out.status_code == 200
    body = out.json()
    assert sorted(body["data"].split()) == ["node=jb-gpu-0", "node=jb-gpu-1"]
    assert body["eof"] and body["next_offset"] == body["size"]
    tail = user_api.get(
        f"/api/v1/clusters/jb/jobs/{job['job_id']}/output?offset={body['size'] - 9}"
    ).json()
    assert tail["data"] == "jb-gpu-" + body["data"][-2:] or tail["data"].endswith("\n")

    detail = user_api.get(f"/api/v1/clusters/jb/jobs/{job['job_id']}").json()
    assert [h["state"] for h in detail["history"]][0] == "PENDING"
    assert detail["history"][-1]["state"] == "COMPLETED"
    assert detail["options"]["env"] == {"GREETING": "hi there"}


def test_cancel_running_job_then_cancel_again_is_409(cluster, user_api):
    job_id = submit(user_api, {"name": "sleeper", "script": "#!/bin/bash\nsleep 120\n"}).json()[
        "job_id"
    ]
    wait_state(cluster, job_id, {"RUNNING"})
    response = user_api.post(f"/api/v1/clusters/jb/jobs/{job_id}/cancel")
    assert response.status_code == 202
    conf = cluster_root("jb") / "etc" / "slurm.conf"

    def squeue_state() -> str:
        return subprocess.run(
            ["squeue", "--noheader", "--states=all", f"--jobs={job_id}", "--format=%T"],
            capture_output=True,
            text=True,
            env=dict(os.environ, SLURM_CONF=str(conf)),
        ).stdout.strip()

    wait_until(lambda: squeue_state() == "CANCELLED", what="CANCELLED in squeue", every=0.1)
    assert wait_state(cluster, job_id, {"CANCELLED"}).state == "CANCELLED"
    assert user_api.get(f"/api/v1/clusters/jb/jobs/{job_id}").json()["state"] == "CANCELLED"
    again = user_api.post(f"/api/v1/clusters/jb/jobs/{job_id}/cancel")
    assert again.status_code == 409
    assert "CANCELLED" in again.json()["error"]["message"]


def test_hold_release_and_requeue(cluster, user_api):
    blocker = submit(user_api, {"name": "blocker", "script": "#!/bin/bash\nsleep 60\n"}).json()
    waiting = submit(
        user_api,
        {
            "name": "waiter",
            "script": "#!/bin/bash\ntrue\n",
            "dependency": f"afterok:{blocker['job_id']}",
        },
    ).json()
    wait_state(cluster, blocker["job_id"], {"RUNNING"})
    base = f"/api/v1/clusters/jb/jobs/{waiting['job_id']}"
    assert user_api.post(f"{base}/release").status_code == 409  # not held
    assert user_api.post(f"{base}/hold").status_code == 202
    assert Job.objects.get(job_id=waiting["job_id"]).reason == "JobHeldUser"
    assert user_api.post(f"{base}/hold").status_code == 409
    assert user_api.post(f"{base}/release").status_code == 202
    assert Job.objects.get(job_id=waiting["job_id"]).reason != "JobHeldUser"
    assert user_api.post(f"{base}/requeue").status_code == 409  # pending: nothing to requeue
    requeue = user_api.post(f"/api/v1/clusters/jb/jobs/{blocker['job_id']}/requeue")
    assert requeue.status_code == 202
    requeued = wait_state(cluster, blocker["job_id"], {"PENDING", "RUNNING"})
    assert requeued.requeue_count == 1
    assert any("requeue requested by uma" in e.cause for e in requeued.events.all())


def test_users_see_only_their_own_jobs(cluster, user_api, other_api, operator_api):
    mine = submit(user_api, {"name": "a-job", "script": "#!/bin/bash\nsleep 30\n"}).json()
    theirs = submit(other_api, {"name": "b-job", "script": "#!/bin/bash\nsleep 30\n"}).json()
    listed = other_api.get("/api/v1/clusters/jb/jobs").json()
    assert [j["job_id"] for j in listed["results"]] == [theirs["job_id"]]
    assert other_api.get(f"/api/v1/clusters/jb/jobs/{mine['job_id']}").status_code == 404
    assert other_api.post(f"/api/v1/clusters/jb/jobs/{mine['job_id']}/cancel").status_code == 404
    assert other_api.get(f"/api/v1/clusters/jb/jobs/{mine['job_id']}/output").status_code == 404
    everyone = operator_api.get("/api/v1/clusters/jb/jobs").json()
    assert {j["job_id"] for j in everyone["results"]} == {mine["job_id"], theirs["job_id"]}
    by_owner = operator_api.get("/api/v1/clusters/jb/jobs?owner=bob").json()
    assert [j["name"] for j in by_owner["results"]] == ["b-job"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"name": "evil\n#SBATCH --nodes=99", "script": "#!/bin/bash\ntrue"}, "name"),
        ({"name": "a #SBATCH --wrap=x", "script": "#!/bin/bash\ntrue"}, "name"),
        ({"name": "../../etc", "script": "#!/bin/bash\ntrue"}, "name"),
        ({"name": "ok", "script": "#!/bin/bash\ntrue", "env": {"X": "$(rm -rf /)"}}, "env.X"),
        ({"name": "ok", "script": "#!/bin/bash\ntrue", "env": {"X": "`id`"}}, "env.X"),
        ({"name": "ok", "script": "#!/bin/bash\ntrue", "env": {"X": "a\nb"}}, "env.X"),
        (
            {"name": "ok", "script": "#!/bin/bash\ntrue", "env": {"LD_PRELOAD": "x.so"}},
            "env.LD_PRELOAD",
        ),
        ({"name": "ok", "script": "#!/bin/bash\ntrue", "partition": "../gpu"}, "partition"),
        ({"name": "ok", "script": "#!/bin/bash\ntrue", "partition": "nope"}, "partition"),
        ({"name": "ok", "script": "#!/bin/bash\ntrue", "dependency": "afterok:1;rm"}, "dependency"),
        ({"name": "ok", "script": "#!/bin/bash\ntrue", "array": "0-5\n#SBATCH"}, "array"),
        ({"name": "ok", "script": "#!/bin/bash\ntrue", "nodes": 0}, "nodes"),
        ({"name": "ok", "script": "#!/bin/bash\ntrue", "nodes": "2"}, "nodes"),
        ({"name": "ok", "script": "#!/bin/bash\ntrue", "gpus_per_node": 9}, "gpus_per_node"),
        ({"name": "ok", "script": "#!/bin/bash\ntrue", "time_limit": "1 day"}, "time_limit"),
        ({"name": "ok", "script": "echo no shebang"}, "script"),
        ({"name": "ok", "script": "#!/bin/bash\ntrue", "requeue": "yes"}, "requeue"),
        ({"name": "ok", "script": "#!/bin/bash\ntrue", "output": "/etc/passwd"}, "output"),
    ],
)
def test_injection_attempts_get_400_and_reach_nothing(cluster, user_api, body, field):
    response = submit(user_api, body)
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"]
    assert squeue_ids("jb") == [] and not Job.objects.exists()


@pytest.mark.parametrize(
    "path",
    [
        "abc",
        "1;ls",
        "..",
        "12_x",
        "-1",
        "1%0A2",
    ],
)
def test_non_numeric_job_ids_get_400(cluster, user_api, path):
    for suffix in ("", "/cancel", "/output"):
        method = user_api.post if suffix == "/cancel" else user_api.get
        response = method(f"/api/v1/clusters/jb/jobs/{path}{suffix}")
        assert response.status_code == 400, (path, suffix, response.content)
        assert response.json()["error"]["fields"] == {"job_id": "Must match ^\\d+(_\\d+)?$."}


def test_paths_outside_the_api_are_json_404(cluster, user_api):
    response = user_api.get("/api/v1/clusters/jb/jobs/..%2F..%2Fetc/output")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "NOT_FOUND"


def test_output_request_is_checked(cluster, user_api):
    job_id = submit(user_api, {"name": "o", "script": "#!/bin/bash\necho hi\n"}).json()["job_id"]
    for query in ("stream=../../etc/passwd", "stream=stdin", "offset=-5", "offset=abc"):
        response = user_api.get(f"/api/v1/clusters/jb/jobs/{job_id}/output?{query}")
        assert response.status_code == 400, query


def test_array_job_tasks_and_filters(cluster, user_api):
    job = submit(
        user_api,
        {"name": "sweep", "script": "#!/bin/bash\necho $SLURM_ARRAY_TASK_ID\n", "array": "0-3"},
    ).json()

    def all_done():
        tasks = list(Job.objects.filter(cluster=cluster, array_task_id__isnull=False))
        return tasks if len(tasks) == 4 and all(t.state == "COMPLETED" for t in tasks) else None

    tasks = wait_until(
        all_done, before=lambda: jobs_sync(cluster=cluster), what="4 array tasks COMPLETED"
    )
    assert {t.owner.username for t in tasks} == {"uma"}
    assert Job.objects.get(job_id=job["job_id"]).state == "COMPLETED"
    out = user_api.get(f"/api/v1/clusters/jb/jobs/{job['job_id']}_2/output").json()
    assert out["data"] == "2\n"
    listed = user_api.get("/api/v1/clusters/jb/jobs?state=COMPLETED&name=swe").json()
    assert [j["job_id"] for j in listed["results"]] == [
        job["job_id"],
        *[f"{job['job_id']}_{i}" for i in range(4)],
    ]
    assert user_api.get("/api/v1/clusters/jb/jobs?state=BOGUS").status_code == 400


def test_jobs_submitted_from_a_shell_are_listed_for_operators(cluster, operator_api, user_api):
    conf = cluster_root("jb") / "etc" / "slurm.conf"
    subprocess.run(
        ["sbatch", "--job-name=<script>alert(1)</script>", "--wrap", "true", "-o", "/dev/null"],
        env=dict(os.environ, SLURM_CONF=str(conf)),
        check=True,
        capture_output=True,
    )
    jobs_sync(cluster=cluster)
    names = [j["name"] for j in operator_api.get("/api/v1/clusters/jb/jobs").json()["results"]]
    assert names == ["<script>alert(1)</script>"]
    assert user_api.get("/api/v1/clusters/jb/jobs").json()["count"] == 0
