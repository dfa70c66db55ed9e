"""Slurm accounts and limits managed from mtc, against real MariaDB + slurmdbd + Slurm
(scripts/test.sh starts the first two): an account's GrpTRES holds a second job back
with AssocGrpGRES, explained in words; nobody submits under an account not theirs."""

import os

import pytest
from django.test import Client
from django.urls import reverse

from clusters import services as cluster_services
from clusters.models import Cluster, SlurmAssociation
from clusters.providers import get_provider
from jobs.models import Job
from jobs.sync import jobs_sync
from slurm import accounts as sacctmgr

from .conftest import make_spec
from .waiting import wait_until

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        not os.environ.get("MTC_SLURMDBD_PORT"),
        reason="no slurmdbd (scripts/test.sh starts one; MTC_TEST_ACCOUNTING=0 skips it)",
    ),
]

JOB = {"name": "hold", "script": "#!/bin/bash\nsleep 120\n", "nodes": 1, "gpus_per_node": 8}


@pytest.fixture
def cluster(local_clusters):
    cluster_services.cluster_create(spec=make_spec("acl", nodes=2))
    return Cluster.objects.get(cluster_id="acl")


def test_grp_tres_holds_the_second_job_and_others_accounts_are_refused(
    cluster, operator_api, user, user_api, django_user_model
):
    body = {"name": "llm", "shares": 3, "grp_tres": "gres/gpu=8", "max_tres_per_user": ""}
    created = operator_api.post("/api/v1/accounts", body, format="json")
    assert created.status_code == 201, created.json()
    assert user_api.post("/api/v1/accounts", {"name": "x"}, format="json").status_code == 403
    bad = operator_api.post("/api/v1/accounts", {"name": "Bad!", "grp_tres": "gpu"}, format="json")
    assert set(bad.json()["error"]["fields"]) == {"name", "grp_tres"}
    assert operator_api.post("/api/v1/accounts/llm/users/uma").status_code == 200

    # Someone else's account: 400 naming `account`, nothing submitted.
    other = django_user_model.objects.create_user("omar")
    operator_api.post("/api/v1/accounts", {"name": "vision"}, format="json")
    operator_api.post("/api/v1/accounts/vision/users/omar")
    refused = user_api.post(
        "/api/v1/clusters/acl/jobs", {**JOB, "account": "vision"}, format="json"
    )
    assert refused.status_code == 400
    assert set(refused.json()["error"]["fields"]) == {"account"}
    assert not Job.objects.exists() and other

    first = user_api.post("/api/v1/clusters/acl/jobs", JOB, format="json")  # default: llm
    second = user_api.post("/api/v1/clusters/acl/jobs", {**JOB, "account": "llm"}, format="json")
    assert first.status_code == second.status_code == 201, (first.json(), second.json())
    assert SlurmAssociation.objects.filter(cluster=cluster, account="llm").count() == 2
    job_id = second.json()["job_id"]
    try:
        wait_until(
            lambda: (
                jobs_sync(cluster=cluster) is not None
                and Job.objects.get(job_id=job_id).reason == "AssocGrpGRES"
            ),
            what=lambda: (
                f"AssocGrpGRES on the second job: {Job.objects.values('job_id', 'state', 'reason')}"
            ),
            timeout=30,
            every=1,
        )
        assert Job.objects.get(job_id=first.json()["job_id"]).state == "RUNNING"
        detail = user_api.get(f"/api/v1/clusters/acl/jobs/{job_id}").json()
        assert (
            "account llm reached its GPU limit (8 of 8 GPUs in use)"
            in detail["pending_explanation"]
        )
        page = Client()
        page.force_login(user)
        html = page.get(reverse("jobs:detail", args=["acl", job_id])).content.decode()
        assert "Account llm reached its GPU limit" in html

        # A PATCH changes the limit in slurmdbd at once: the second job starts.
        patched = operator_api.patch(
            "/api/v1/accounts/llm", {"grp_tres": "gres/gpu=16"}, format="json"
        )
        assert patched.status_code == 200, patched.json()
        client = get_provider(cluster.provider).slurm(cluster)
        rows = sacctmgr.associations(client, cluster="acl")
        assert [r.grp_tres for r in rows if r.account == "llm" and not r.user] == ["gres/gpu=16"]

        def started() -> bool:
            jobs_sync(cluster=cluster)
            return Job.objects.get(job_id=job_id).state == "RUNNING"

        wait_until(
            started, what="the second job to start under the raised limit", timeout=30, every=1
        )
    finally:
        client = get_provider(cluster.provider).slurm(cluster)
        for job in Job.objects.all():
            client.run(["scancel", job.job_id], check=False)
