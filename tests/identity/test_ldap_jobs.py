"""A directory person end to end on a real local cluster and the real slapd: signs in
with the directory password, submits from the web UI, and the job runs with the
directory's uidNumber; a person without a posixAccount may sign in but not run jobs."""

from __future__ import annotations

import pytest

from clusters import services as cluster_services
from clusters.models import Cluster
from jobs.models import Job

from ..conftest import make_spec
from .test_owner import wait_state

pytestmark = pytest.mark.slurm

SUBMIT_FORM = {"nodes": "1", "ntasks_per_node": "1", "gpus_per_node": "0", "cpus_per_task": "1"}


@pytest.fixture
def cluster(local_clusters, ldap_mode):
    cluster_services.cluster_create(spec=make_spec("ldj", nodes=1))
    return Cluster.objects.get(cluster_id="ldj")


def sign_in(client, ldap_mode, person: str) -> None:
    response = client.post(
        "/accounts/login/",
        {"username": ldap_mode.username(person), "password": ldap_mode.passwords[person]},
    )
    assert response.status_code == 302, response.content.decode()[:500]


def test_a_directory_person_submits_and_the_job_runs_as_their_uid_number(
    cluster, client, ldap_mode
):
    sign_in(client, ldap_mode, "alice")
    response = client.post(
        "/clusters/ldj/jobs/submit/",
        {**SUBMIT_FORM, "name": "whoami", "script": "#!/bin/bash\nid -u\nid -un\n"},
    )
    assert response.status_code == 302, response.content.decode()[-2000:]
    job = Job.objects.get(cluster=cluster)
    assert job.user == ldap_mode.username("alice")
    assert wait_state(cluster, job.job_id, {"COMPLETED", "FAILED"}).state == "COMPLETED"
    out = client.get(f"/api/v1/clusters/ldj/jobs/{job.job_id}/output?stream=stdout")
    assert out.json()["data"].split() == [str(ldap_mode.uid("alice")), ldap_mode.username("alice")]


def test_a_directory_person_without_a_posix_account_gets_403(cluster, client, ldap_mode):
    sign_in(client, ldap_mode, "carol")
    response = client.post(
        "/api/v1/clusters/ldj/jobs",
        {"name": "nope", "script": "#!/bin/bash\nid\n"},
        content_type="application/json",
    )
    assert response.status_code == 403
    body = response.json()
    assert body["error"]["code"] == "PERMISSION_DENIED"
    assert "no posixAccount (uidNumber, gidNumber, homeDirectory)" in body["error"]["message"]
    assert not Job.objects.exists()
    assert client.get("/profile/").status_code == 403
