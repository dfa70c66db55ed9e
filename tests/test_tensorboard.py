"""TensorBoard through mtc: login required, the page and its data API through the proxy,
one process per cluster (reused, restarted when the runs grow), the idle stop.

Event files are written with torch's SummaryWriter into the jobs' run dirs (no training);
the rows and the event files are made once for the module, and every process started
here is stopped by pid at the end."""

from __future__ import annotations

import json
import os
import time

import pytest
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.test import Client, RequestFactory
from torch.utils.tensorboard import SummaryWriter

from clusters.models import Cluster
from clusters.providers import procs
from jobs.models import Job
from recipes import tasks, tensorboard
from recipes.tensorboard_views import tensorboard_proxy

from .conftest import make_spec

pytestmark = pytest.mark.django_db
CLUSTER_ID = "tbtest"
PREFIX = f"/clusters/{CLUSTER_ID}/tensorboard"


def write_events(run_dir, losses: list[float]) -> None:
    writer = SummaryWriter(log_dir=str(run_dir / "tb"))
    for step, loss in enumerate(losses):
        writer.add_scalar("train/loss", loss, step)
    writer.close()


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker, tmp_path_factory):
    """A cluster, an owner, an outsider and two recipe jobs with event files."""
    root = tmp_path_factory.mktemp("runs")
    with django_db_blocker.unblock():
        from django.contrib.auth import get_user_model

        users = get_user_model().objects
        owner = users.create_user("tess", password="pw-tess-123")
        outsider = users.create_user("otto", password="pw-otto-123")
        cluster = Cluster.objects.create(
            cluster_id=CLUSTER_ID, spec=make_spec(CLUSTER_ID), state="RUNNING"
        )
        jobs = []
        for number, name in ((11, "sft tiny"), (12, "sft: lr=3e-4, big")):
            run_dir = root / f"run{number}"
            write_events(run_dir, [2.0 / (step + 1) for step in range(5)])
            jobs.append(
                Job.objects.create(
                    cluster=cluster,
                    job_id=str(number),
                    job_number=number,
                    name=name,
                    user="slurm",
                    owner=owner,
                    recipe="sft",
                    checkpoint_dir=str(run_dir / "checkpoints"),
                    state="COMPLETED",
                )
            )
    yield {"owner": owner, "outsider": outsider, "cluster": cluster, "jobs": jobs}
    tensorboard.tensorboard_stop(CLUSTER_ID)
    with django_db_blocker.unblock():
        Job.objects.filter(cluster=cluster).delete()
        cluster.delete()
        users.filter(pk__in=[owner.pk, outsider.pk]).delete()


@pytest.fixture
def owner_client(world) -> Client:
    client = Client()
    client.force_login(world["owner"])
    return client


def body(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


def wait_for_runs(client: Client, names: set[str], timeout: float = 20.0) -> list[str]:
    """TensorBoard reads event files in the background: ask until the runs are listed."""
    deadline = time.monotonic() + timeout
    while True:
        response = client.get(f"{PREFIX}/data/runs")
        assert response.status_code == 200
        runs = json.loads(body(response))
        if names <= {run.split("/")[0] for run in runs} or time.monotonic() > deadline:
            return runs
        time.sleep(0.3)


def test_anonymous_requests_are_refused(world):
    anonymous = Client()
    for path in (f"{PREFIX}/", f"{PREFIX}/data/runs"):
        response = anonymous.get(path)
        assert response.status_code == 302
        assert response.url.startswith(settings.LOGIN_URL)
    response = anonymous.post(f"{PREFIX}/data/plugin/timeseries/timeSeries", {"requests": "[]"})
    assert response.status_code == 302 and response.url.startswith(settings.LOGIN_URL)
    response = anonymous.post(f"/clusters/{CLUSTER_ID}/jobs/11/tensorboard/")
    assert response.status_code == 302 and response.url.startswith(settings.LOGIN_URL)
    # Without the middleware in front, the view itself refuses too.
    request = RequestFactory().get(f"{PREFIX}/data/runs")
    request.user = AnonymousUser()
    assert tensorboard_proxy(request, CLUSTER_ID, "data/runs").status_code == 401


def test_open_serves_tensorboard_and_its_data_through_mtc(world, owner_client):
    job = world["jobs"][0]
    response = owner_client.post(f"/clusters/{CLUSTER_ID}/jobs/{job.job_id}/tensorboard/")
    assert response.status_code == 302 and response.url == f"{PREFIX}/"

    page = owner_client.get(f"{PREFIX}/")
    assert page.status_code == 200
    assert page["Content-Type"].startswith("text/html")
    assert b"<tb-webapp>" in body(page)

    run = tensorboard.run_name(job)
    assert run == "11-sft-tiny"
    runs = wait_for_runs(owner_client, {run})
    assert any(r.startswith(run) for r in runs)
    listed = next(r for r in runs if r.startswith(run))

    # A data query through the proxy, GET and POST (the time-series view posts).
    scalars = owner_client.get(f"{PREFIX}/data/plugin/scalars/scalars?run={listed}&tag=train/loss")
    assert scalars.status_code == 200
    values = [point[2] for point in json.loads(body(scalars))]
    assert values == pytest.approx([2.0, 1.0, 2 / 3, 0.5, 0.4])
    posted = owner_client.post(
        f"{PREFIX}/data/plugin/timeseries/timeSeries",
        {"requests": json.dumps([{"plugin": "scalars", "tag": "train/loss"}])},
    )
    assert posted.status_code == 200
    assert listed in json.loads(body(posted))[0]["runToSeries"]

    # Another user has no run there: refused, though signed in.
    outsider = Client()
    outsider.force_login(world["outsider"])
    assert outsider.get(f"{PREFIX}/data/runs").status_code == 403


def test_one_process_per_cluster_reused_and_restarted_when_runs_grow(world, owner_client):
    first, second = world["jobs"]
    board = tensorboard.tensorboard_open(cluster=world["cluster"], jobs=[first])
    again = tensorboard.tensorboard_open(cluster=world["cluster"], jobs=[first])
    assert again.pid == board.pid and again.port == board.port
    assert procs.processes_mentioning(f"--path_prefix={PREFIX}\0") == [board.pid]

    grown = tensorboard.tensorboard_open(cluster=world["cluster"], jobs=[second])
    assert grown.pid != board.pid and not procs.is_running(board.pid)
    assert set(grown.runs) == {tensorboard.run_name(first), tensorboard.run_name(second)}
    assert procs.processes_mentioning(f"--path_prefix={PREFIX}\0") == [grown.pid]
    runs = wait_for_runs(owner_client, set(grown.runs))
    assert {r.split("/")[0] for r in runs} == set(grown.runs)

    # A pid file naming some other process is not taken for the TensorBoard.
    pidfile = settings.DATA_DIR / "tensorboard" / CLUSTER_ID / "tensorboard.pid"
    pidfile.write_text(f"{os.getpid()}\n")
    assert tensorboard.tensorboard_get(CLUSTER_ID) is None
    pidfile.write_text(f"{grown.pid}\n")
    assert tensorboard.tensorboard_get(CLUSTER_ID).pid == grown.pid


def test_idle_tensorboard_is_stopped(world, owner_client, settings):
    board = tensorboard.tensorboard_open(cluster=world["cluster"], jobs=world["jobs"][:1])
    settings.MTC_TENSORBOARD_IDLE_S = 60
    # State of a cluster that no longer exists is cleared as well.
    gone = settings.DATA_DIR / "tensorboard" / "gone-cluster"
    gone.mkdir(parents=True)
    (gone / "tensorboard.pid").write_text("999999\n")

    assert tasks.tensorboards_stop_idle() == 0  # just used: kept
    assert procs.is_running(board.pid) and not gone.exists()

    an_hour_ago = time.time() - 3600
    os.utime(settings.DATA_DIR / "tensorboard" / CLUSTER_ID / "last_access", (an_hour_ago,) * 2)
    assert tasks.tensorboards_stop_idle() == 1
    assert not procs.is_running(board.pid)
    assert tensorboard.tensorboard_get(CLUSTER_ID) is None
    response = owner_client.get(f"{PREFIX}/")
    assert response.status_code == 503
    assert b"not running" in response.content
