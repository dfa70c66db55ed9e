"""A hostile user's links, FIFOs and swaps in their own folders, against every place
mtc (root) makes, writes or reads there: job submits, recipe launches (API and web,
with a chosen run name), endpoint deploys and replica tokens, the metrics, step-time,
stacks and output reads of the poller's rounds. mtc refuses or replaces what was
planted; the root-only target stays as it was. Slurm's own boundary (sbatch) is faked:
what is judged here happens before it. Real Unix accounts plant the links."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import time
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone

from identity.services import account_ensure
from jobs.models import Job, JobMetric

from ..test_api_recipes import cluster, submits
from ..test_recipe_pages import form_values
from .conftest import make_dirs, make_fifo, plant_link

pytestmark = pytest.mark.security
__all__ = ["cluster", "submits"]  # fixtures these tests use: the cluster rc, a fake sbatch
JOBS = "/api/v1/clusters/rc/jobs"
LAUNCH_API = "/api/v1/clusters/rc/recipes/llama-pretrain/launch"
LAUNCH_PAGE = "/clusters/rc/recipes/llama-pretrain/launch/"


@pytest.fixture
def users_folder(settings):
    """The cluster's users/ folder, emptied after the test (the next test's accounts
    may take the same names with other uids)."""
    path = Path(settings.DATA_DIR) / "clusters" / "rc" / "users"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def home(cluster, local_identity, users_folder, user, user_api, submits):
    """The user's folder of the cluster, made by a first job of theirs; (its path, the
    account)."""
    first = {"name": "first", "script": "#!/bin/bash\ntrue\n"}
    response = user_api.post(JOBS, first, format="json")
    assert response.status_code == 201, response.content
    account = account_ensure(user=user)
    path = users_folder / account.name
    assert path.stat().st_uid == account.uid
    return path, account


def refused(response, folder: Path) -> None:
    assert response.status_code == 409, response.content
    message = response.json()["error"]["message"]
    assert str(folder) in message and "symbolic link" in message, message


@pytest.mark.parametrize("folder", ["work", "output"])
def test_a_link_swapped_in_for_a_job_folder_is_refused_and_its_target_untouched(
    home, user_api, submits, root_only, folder
):
    path, account = home
    plant_link(account, path / folder, root_only.path)
    second = {"name": "second", "script": "#!/bin/bash\ntrue\n"}
    response = user_api.post(JOBS, second, format="json")
    refused(response, path / folder)
    root_only.assert_untouched()
    assert len(submits) == 1 and os.path.islink(path / folder)


def test_a_link_for_runs_is_refused_on_a_recipe_launch_through_the_api(
    home, user_api, submits, root_only
):
    path, account = home
    plant_link(account, path / "runs", root_only.path)
    response = user_api.post(LAUNCH_API, {"overrides": {"steps": 4}}, format="json")
    refused(response, path / "runs")
    root_only.assert_untouched()
    assert len(submits) == 1 and not Job.objects.filter(recipe="llama-pretrain").exists()


def test_a_chosen_run_name_planted_as_a_link_is_taken_on_a_web_launch(
    home, user, submits, root_only
):
    path, account = home
    client = Client()
    client.force_login(user)
    text = client.post(LAUNCH_PAGE, form_values()).content.decode()
    digest = re.search(r'name="previewed" value="([^"]*)"', text).group(1)
    name = "llama-pretrain-20261207-120000-abcd"  # a name the form takes back
    make_dirs(account, path / "runs")
    # Dangling when mtc looks (so "exists" says no), inside the root-only folder.
    plant_link(account, path / "runs" / name, root_only.path / "planted")
    posted = {**form_values(), "run_name": name, "launch": "1", "previewed": digest}
    response = client.post(LAUNCH_PAGE, posted)
    assert response.status_code == 200
    assert "This run directory is taken" in response.content.decode()
    root_only.assert_untouched()
    assert len(submits) == 1
    # The runs folder itself a link: the launch is refused beside the form.
    plant_link(account, path / "runs", root_only.path)
    response = client.post(LAUNCH_PAGE, {**posted, "run_name": ""})
    assert "symbolic link" in response.content.decode()
    root_only.assert_untouched()
    assert len(submits) == 1


@pytest.fixture
def endpoint(home, user_api, settings):
    from registry.models import Model, ModelVersion, VersionState
    from serving.models import Endpoint

    export = Path(settings.DATA_DIR) / "registry" / "tiny" / "1"
    export.mkdir(parents=True, exist_ok=True)
    (export / "config.json").write_text("{}\n")
    model = Model.objects.create(name="tiny")
    ModelVersion.objects.create(
        model=model, number=1, state=VersionState.READY, export_path=str(export)
    )
    response = user_api.post(
        "/api/v1/endpoints",
        {"model": "tiny", "version": 1, "cluster": "rc", "name": "ep"},
        format="json",
    )
    assert response.status_code == 201, response.content
    return Endpoint.objects.get(name="ep")


def reconcile(endpoint):
    from serving.reconcile import endpoint_reconcile

    from ..test_serving_support import redis_forget_serving

    redis_forget_serving()  # a lock an earlier test's endpoint of the same id left
    endpoint_reconcile(endpoint_id=endpoint.pk)
    endpoint.refresh_from_db()
    return endpoint


def test_a_link_for_the_serving_folder_is_refused_on_a_deploy(home, endpoint, submits, root_only):
    path, account = home
    plant_link(account, path / "serving", root_only.path)
    reconcile(endpoint)
    assert "symbolic link" in endpoint.status_message, endpoint.status_message
    root_only.assert_untouched()
    assert len(submits) == 1 and not endpoint.replicas.exists()


def test_a_link_at_the_replica_token_path_is_replaced_and_its_target_untouched(
    home, endpoint, submits, root_only
):
    path, account = home
    replica_dir = path / "serving" / f"endpoint-{endpoint.pk}" / "replica-1"  # predictable
    make_dirs(account, replica_dir)
    plant_link(account, replica_dir / "token", root_only.file)
    reconcile(endpoint)
    assert endpoint.replicas.count() == 1 and len(submits) == 2, endpoint.status_message
    root_only.assert_untouched()
    info = os.lstat(replica_dir / "token")
    assert stat.S_ISREG(info.st_mode) and info.st_uid == account.uid
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert (replica_dir / "token").read_text() == endpoint.replica_token + "\n"


# --- the poller's reads -------------------------------------------------------------------
def recipe_job(cluster, owner, run_dir: Path, job_id: str) -> Job:
    return Job.objects.create(
        cluster=cluster,
        job_id=job_id,
        job_number=int(job_id),
        name="run",
        user=account_ensure(user=owner).name,
        partition="gpu",
        state="RUNNING",
        nodes=1,
        node_list="rc-gpu-0",
        submit_time=timezone.now(),
        start_time=timezone.now(),
        owner=owner,
        submitted_by_mtc=True,
        script="#!/bin/bash\n",
        recipe="llama-pretrain",
        checkpoint_dir=str(run_dir / "checkpoints"),
        metrics={"world_size": 1},
    )


def metric_line(step: int, loss: float) -> str:
    return json.dumps({"step": step, "loss": loss, "time": time.time()}) + "\n"


@pytest.fixture
def two_runs(home, cluster, user, django_user_model):
    """Ann's run with a metrics line of hers, and the hostile user's run."""
    from jobs.services import job_root

    path, account = home
    ann = django_user_model.objects.create_user("ann", password="pw-ann-123")
    anns = account_ensure(user=ann)
    ann_run = job_root(cluster, anns) / "runs" / "r-ann"
    make_dirs(anns, ann_run / "checkpoints")
    (ann_run / "metrics.jsonl").write_text(metric_line(1, 7.25))
    os.chown(ann_run / "metrics.jsonl", anns.uid, anns.gid)
    mine = path / "runs" / "r-mine"
    make_dirs(account, mine / "checkpoints")
    make_dirs(account, mine / "steptimes")
    make_dirs(account, mine / "stacks")
    return {
        "ann": recipe_job(cluster, ann, ann_run, "501"),
        "mine": recipe_job(cluster, user, mine, "502"),
        "ann_run": ann_run,
        "run": mine,
        "account": account,
    }


@pytest.mark.parametrize("plant", ["fifo", "link-to-another-users-file", "link-to-root-only"])
def test_run_files_planted_as_links_or_fifos_are_not_read_and_others_rounds_go_on(
    two_runs, cluster, root_only, plant
):
    from recipes.hang import stacks_collect
    from recipes.straggler import job_step_times
    from recipes.tasks import recipe_round

    run, account = two_runs["run"], two_runs["account"]
    secret = root_only.file
    secret_line = json.dumps(
        {"step": 1, "rank": 0, "compute_s": 9.0, "node": "x", "time": time.time()}
    )
    root_only.file.write_text(root_only.CONTENT)  # what a read would have to show
    targets = {
        "link-to-another-users-file": two_runs["ann_run"] / "metrics.jsonl",
        "link-to-root-only": secret,
    }
    for name in ("metrics.jsonl", "steptimes/rank-0.jsonl", "stacks/rank-0.txt"):
        if plant == "fifo":
            make_fifo(account, run / name)
        else:
            plant_link(account, run / name, targets[plant])
    started = time.monotonic()
    recipe_round(cluster)
    assert time.monotonic() - started < 10
    ann, mine = two_runs["ann"], two_runs["mine"]
    assert JobMetric.objects.filter(job=ann).count() == 1  # the other user's round went on
    assert not JobMetric.objects.filter(job=mine).exists()
    assert job_step_times(mine) == []

    started = time.monotonic()
    ranks = stacks_collect(mine, 1)
    assert time.monotonic() - started < 10
    assert ranks[0].text == "" and "CANARY" not in ranks[0].node
    assert secret_line not in root_only.file.read_text()
    root_only.assert_untouched()


def test_the_hang_handlers_note_goes_only_into_the_jobs_own_stderr(two_runs, root_only):
    from jobs.selectors import job_output_path
    from recipes.hang import _output_append

    mine = two_runs["mine"]
    stderr = job_output_path(mine, "stderr")
    plant_link(two_runs["account"], stderr, root_only.file)
    _output_append(mine, "mtc: job hung\n")
    root_only.assert_untouched()
    assert os.path.islink(stderr)
