"""Pending reasons in words (jobs/pending.py) from stored rows only, the account API's
validation and access rules, and an account that is not the user's refused before
anything reaches Slurm: database-only, no daemons."""

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from clusters.models import Cluster, SlurmAccount
from jobs.models import Job
from jobs.pending import pending_explanation

from .conftest import make_spec

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster():
    return Cluster.objects.create(cluster_id="pr", spec=make_spec("pr"), state="RUNNING")


def job(cluster, number, **fields) -> Job:
    defaults = dict(name="j", user="uma", partition="gpu", state="PENDING", nodes=1)
    defaults.update(fields)
    return Job.objects.create(cluster=cluster, job_id=str(number), job_number=number, **defaults)


def test_resources_count_the_jobs_ahead_and_show_the_expected_start(cluster):
    job(cluster, 1, reason="Resources")
    job(cluster, 2, reason="Priority")
    soon = timezone.now() + timedelta(minutes=30)
    waiting = job(
        cluster, 3, nodes=2, gpus_per_node=8, reason="Resources", expected_start_time=soon
    )
    text = pending_explanation(waiting)
    assert text.startswith("waiting for 2 free nodes with 8 GPUs in partition gpu; 2 jobs ahead")
    assert f"expected start {timezone.localtime(soon):%H:%M}" in text


def test_the_expected_start_shows_on_the_job_page_the_queue_and_the_api(cluster, user, user_api):
    soon = timezone.now() + timedelta(minutes=40)
    waiting = job(cluster, 7, reason="Resources", expected_start_time=soon, owner=user)
    unplanned = job(cluster, 8, reason="Resources", owner=user)
    page = Client()
    page.force_login(user)
    local = timezone.localtime(soon)
    detail = page.get(reverse("jobs:detail", args=["pr", waiting.job_id])).content.decode()
    assert f"expected start {local:%H:%M}" in detail
    assert f"{local:%Y-%m-%d %H:%M}" in detail  # the Expected start row
    queue = page.get(reverse("jobs:queue", args=["pr"])).content.decode()
    assert "expected <time datetime=" in queue and f"{local:%m-%d %H:%M}" in queue
    body = user_api.get(f"/api/v1/clusters/pr/jobs/{waiting.job_id}").json()
    assert body["expected_start_time"] == soon.isoformat().replace("+00:00", "Z")
    other = user_api.get(f"/api/v1/clusters/pr/jobs/{unplanned.job_id}").json()
    assert other["expected_start_time"] is None
    assert "expected start" not in pending_explanation(unplanned)


def test_a_group_gpu_limit_names_the_account_and_the_gpus_in_use(cluster):
    SlurmAccount.objects.create(name="llm", grp_tres="gres/gpu=16")
    for n in (1, 2):
        job(cluster, n, state="RUNNING", gpus_per_node=8, options={"account": "llm"})
    held = job(cluster, 3, gpus_per_node=8, reason="AssocGrpGRES", options={"account": "llm"})
    assert pending_explanation(held).startswith(
        "account llm reached its GPU limit (16 of 16 GPUs in use)"
    )


def test_holds_and_other_states(cluster):
    assert pending_explanation(job(cluster, 1, reason="JobHeldAdmin")).startswith(
        "held by an operator (admin)"
    )
    assert pending_explanation(job(cluster, 2, reason="SomethingNew")) == "Slurm says: SomethingNew"
    assert pending_explanation(job(cluster, 3, state="RUNNING", reason="None")) == ""


def test_account_api_validates_and_only_operators_write(operator_api, user_api):
    bad = operator_api.post(
        "/api/v1/accounts",
        {"name": "A b", "shares": -1, "grp_tres": "gres/gpu=x", "qos": "Bad;q", "extra": 1},
        format="json",
    )
    assert bad.status_code == 400
    assert set(bad.json()["error"]["fields"]) == {"name", "shares", "grp_tres", "qos", "extra"}
    assert not SlurmAccount.objects.exists()
    assert user_api.post("/api/v1/accounts", {"name": "llm"}, format="json").status_code == 403
    ok = operator_api.post("/api/v1/accounts", {"name": "llm", "shares": 2}, format="json")
    assert ok.status_code == 201 and ok.json()["shares"] == 2
    again = operator_api.post("/api/v1/accounts", {"name": "llm"}, format="json")
    assert again.status_code == 409
    assert user_api.get("/api/v1/accounts/llm").json()["members"] == []
    assert operator_api.post("/api/v1/accounts/llm/users/nobody").status_code == 404
    assert operator_api.post("/api/v1/accounts/llm/users/uma").status_code == 200
    assert user_api.get("/api/v1/accounts/llm").json()["members"] == ["uma"]
    patched = operator_api.patch("/api/v1/accounts/llm", {"name": "x"}, format="json")
    assert set(patched.json()["error"]["fields"]) == {"name"}
    assert operator_api.get("/api/v1/accounts/nope").status_code == 404
    assert operator_api.delete("/api/v1/accounts/llm").status_code == 204


def test_submit_under_an_account_not_theirs_is_refused_before_slurm(cluster, user_api):
    SlurmAccount.objects.create(name="vision")
    body = {"name": "x", "script": "#!/bin/bash\ntrue\n", "account": "vision"}
    answer = user_api.post("/api/v1/clusters/pr/jobs", body, format="json")
    assert answer.status_code == 400
    assert set(answer.json()["error"]["fields"]) == {"account"}
    bad = user_api.post("/api/v1/clusters/pr/jobs", {**body, "account": "Bad!"}, format="json")
    assert set(bad.json()["error"]["fields"]) == {"account"}
    assert not Job.objects.exists()


def test_submit_page_shows_an_account_not_theirs_beside_the_field(cluster, user):
    from django.test import Client
    from django.urls import reverse

    SlurmAccount.objects.create(name="vision")
    page = Client()
    page.force_login(user)
    form = {"name": "x", "script": "#!/bin/bash\ntrue\n", "nodes": 1, "ntasks_per_node": 1}
    form.update(gpus_per_node=0, cpus_per_task=1, requeue="on", account="vision")
    html = page.post(reverse("jobs:submit", args=["pr"]), form).content.decode()
    assert "You are not in account" in html and "vision" in html
    assert not Job.objects.exists()


def test_sacctmgr_refusals_are_slurm_errors(tmp_path):
    from slurm import SlurmError
    from slurm import accounts as sacctmgr
    from slurm.client import SlurmClient

    fake = tmp_path / "sacctmgr"
    fake.write_text("#!/bin/sh\necho ' Job(s) active, cancel job(s) before remove' >&2\nexit 1\n")
    fake.chmod(0o755)
    client = SlurmClient(tmp_path / "slurm.conf")
    env = client.env()
    env["PATH"] = f"{tmp_path}:{env['PATH']}"
    client.env = lambda: env
    with pytest.raises(SlurmError) as caught:
        sacctmgr.account_delete(client, cluster="c1", name="llm")
    assert caught.value.permanent and "Job(s) active" in str(caught.value)
    with pytest.raises(SlurmError):
        sacctmgr.account_delete(client, cluster="c1", name="Bad name")


def test_associations_are_managed_only_where_the_cluster_stores_accounting(cluster, settings):
    """A cluster whose slurm.conf does not name slurmdbd (made before accounting was on,
    or with no daemons yet) is never asked to make associations."""
    from clusters.accounts import accounting_enabled
    from clusters.providers import get_provider

    settings.MTC_SLURMDBD_PORT = 6829
    assert not accounting_enabled(cluster)  # no slurm.conf at all
    conf = get_provider("local").conf_path(cluster)
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text("ClusterName=pr\nAccountingStorageType=accounting_storage/none\n")
    assert not accounting_enabled(cluster)
    conf.write_text("ClusterName=pr\nAccountingStorageType=accounting_storage/slurmdbd\n")
    assert accounting_enabled(cluster)
    settings.MTC_SLURMDBD_PORT = 0
    assert not accounting_enabled(cluster)
