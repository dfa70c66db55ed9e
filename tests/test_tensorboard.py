"""TensorBoard through mtc: login required, the page and its data API through the proxy,
one process per cluster and viewer (reused, restarted when the runs grow), the idle stop;
with MTC_IDENTITY=local each user's runs in a TensorBoard of their own, run as them.

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
from .unix import give
from .waiting import wait_until

pytestmark = pytest.mark.django_db
CLUSTER_ID = "tbtest"
PREFIX = f"/clusters/{CLUSTER_ID}/tensorboard"


@pytest.fixture(autouse=True)
def shared_identity(settings):
    """The world's event files are mtc's (pytest's 0700 tmp dirs): its viewers share
    mtc's account; the local-identity tests below set MTC_IDENTITY=local themselves."""
    settings.MTC_IDENTITY = "single-user"


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


def wait_for_runs(
    client: Client, names: set[str], timeout: float = 20.0, prefix: str = PREFIX
) -> list[str]:
    """TensorBoard reads event files in the background: ask until the runs are listed."""

    def listed() -> list[str] | None:
        response = client.get(f"{prefix}/data/runs")
        assert response.status_code == 200
        runs = json.loads(body(response))
        return runs if names <= {run.split("/")[0] for run in runs} else None

    return wait_until(listed, what=f"TensorBoard to list {sorted(names)}", timeout=timeout)


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


def test_one_process_per_viewer_reused_and_restarted_when_runs_grow(world, owner_client):
    first, second = world["jobs"]
    owner = world["owner"]
    board = tensorboard.tensorboard_open(cluster=world["cluster"], jobs=[first], viewer=owner)
    again = tensorboard.tensorboard_open(cluster=world["cluster"], jobs=[first], viewer=owner)
    assert again.pid == board.pid and again.port == board.port
    assert procs.processes_mentioning(f"--path_prefix={PREFIX}\0") == [board.pid]

    grown = tensorboard.tensorboard_open(cluster=world["cluster"], jobs=[second], viewer=owner)
    assert grown.pid != board.pid and not procs.is_running(board.pid)
    assert set(grown.runs) == {tensorboard.run_name(first), tensorboard.run_name(second)}
    assert procs.processes_mentioning(f"--path_prefix={PREFIX}\0") == [grown.pid]
    runs = wait_for_runs(owner_client, set(grown.runs))
    assert {r.split("/")[0] for r in runs} == set(grown.runs)

    # A pid file naming some other process is not taken for the TensorBoard.
    pidfile = settings.DATA_DIR / "tensorboard" / CLUSTER_ID / f"u{owner.pk}" / "tensorboard.pid"
    pidfile.write_text(f"{os.getpid()}\n")
    assert tensorboard.tensorboard_get(CLUSTER_ID, viewer=owner) is None
    pidfile.write_text(f"{grown.pid}\n")
    assert tensorboard.tensorboard_get(CLUSTER_ID, viewer=owner).pid == grown.pid


def test_idle_tensorboard_is_stopped(world, owner_client, settings):
    owner = world["owner"]
    board = tensorboard.tensorboard_open(
        cluster=world["cluster"], jobs=world["jobs"][:1], viewer=owner
    )
    settings.MTC_TENSORBOARD_IDLE_S = 60
    # State of a cluster that no longer exists is cleared as well.
    gone = settings.DATA_DIR / "tensorboard" / "gone-cluster"
    gone.mkdir(parents=True)
    (gone / "tensorboard.pid").write_text("999999\n")

    assert tasks.tensorboards_stop_idle() == 0  # just used: kept
    assert procs.is_running(board.pid) and not gone.exists()

    an_hour_ago = time.time() - 3600
    state = settings.DATA_DIR / "tensorboard" / CLUSTER_ID / f"u{owner.pk}"
    os.utime(state / "last_access", (an_hour_ago,) * 2)
    assert tasks.tensorboards_stop_idle() == 1
    assert not procs.is_running(board.pid)
    assert tensorboard.tensorboard_get(CLUSTER_ID, viewer=owner) is None
    response = owner_client.get(f"{PREFIX}/")
    assert response.status_code == 503
    assert b"not running" in response.content


# --- MTC_IDENTITY=local: a TensorBoard per user, as that user -------------------------------
ISO_ID = "tbiso"
ISO_PREFIX = f"/clusters/{ISO_ID}/tensorboard"


def uid_of(pid: int) -> int:
    status = open(f"/proc/{pid}/status").read()
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


def run_names(runs: list[str]) -> set[str]:
    return {run.split("/")[0] for run in runs}


@pytest.fixture
def isolated(settings, django_user_model):
    """Two users with their own Unix accounts, each with a recipe run in their own 0700
    run dir on one cluster, and an operator; the accounts go again at the end."""
    from identity.services import account_ensure
    from identity.sources import local
    from jobs.services import job_root

    settings.MTC_IDENTITY = "local"
    cluster = Cluster.objects.create(cluster_id=ISO_ID, spec=make_spec(ISO_ID), state="RUNNING")
    people, accounts = {}, []
    try:
        for number, name in ((21, "ada"), (22, "bob")):
            person = django_user_model.objects.create_user(name, password=f"pw-{name}-123")
            account = account_ensure(user=person)
            accounts.append(account.name)
            run_dir = job_root(cluster, account) / "runs" / f"run{number}"
            write_events(run_dir, [1.0, 0.5])
            give(run_dir.parent, account)
            job = Job.objects.create(
                cluster=cluster,
                job_id=str(number),
                job_number=number,
                name=f"{name} run",
                user=account.name,
                owner=person,
                recipe="sft",
                checkpoint_dir=str(run_dir / "checkpoints"),
                state="COMPLETED",
            )
            client = Client()
            client.force_login(person)
            people[name] = {"user": person, "account": account, "job": job, "client": client}
        operator = django_user_model.objects.create_user("opal", password="pw", is_staff=True)
        people["opal"] = {"user": operator, "client": Client()}
        people["opal"]["client"].force_login(operator)
        yield people
    finally:
        tensorboard.tensorboard_stop(ISO_ID)
        for name in accounts:
            local.account_delete(name)


def test_each_user_has_a_tensorboard_of_their_own_as_their_account(isolated):
    ada, bob, opal = isolated["ada"], isolated["bob"], isolated["opal"]
    ada_run, bob_run = tensorboard.run_name(ada["job"]), tensorboard.run_name(bob["job"])
    assert ada["account"].uid != bob["account"].uid and 0 not in (ada["account"].uid,)

    # Bob may not open Ada's job, and before his own runs he is not passed to hers.
    opened = ada["client"].post(f"/clusters/{ISO_ID}/jobs/21/tensorboard/")
    assert opened.status_code == 302 and opened.url == f"{ISO_PREFIX}/"
    assert bob["client"].post(f"/clusters/{ISO_ID}/jobs/21/tensorboard/").status_code == 404
    refused = bob["client"].get(f"{ISO_PREFIX}/data/runs")
    assert refused.status_code == 503 and ada_run.encode() not in refused.content

    assert run_names(wait_for_runs(ada["client"], {ada_run}, prefix=ISO_PREFIX)) == {ada_run}
    board = tensorboard.tensorboard_get(ISO_ID, viewer=ada["user"])
    assert uid_of(board.pid) == ada["account"].uid

    # Bob's own instance: another process, as Bob, with Bob's runs only.
    assert bob["client"].post(f"/clusters/{ISO_ID}/jobs/22/tensorboard/").status_code == 302
    assert run_names(wait_for_runs(bob["client"], {bob_run}, prefix=ISO_PREFIX)) == {bob_run}
    bobs = tensorboard.tensorboard_get(ISO_ID, viewer=bob["user"])
    assert bobs.pid != board.pid and uid_of(bobs.pid) == bob["account"].uid
    tags = json.loads(body(ada["client"].get(f"{ISO_PREFIX}/data/plugin/scalars/tags")))
    assert run_names(list(tags)) == {ada_run}
    runs = json.loads(body(ada["client"].get(f"{ISO_PREFIX}/data/runs")))
    assert run_names(runs) == {ada_run}

    # Its log and temp files are Ada's alone; mtc's state of it is mtc's alone.
    state = settings.DATA_DIR / "tensorboard" / ISO_ID / f"u{ada['user'].pk}"
    own = os.stat(state / "own")
    assert (own.st_uid, own.st_mode & 0o777) == (ada["account"].uid, 0o700)
    assert os.stat(state / "own" / "tensorboard.log").st_uid == ada["account"].uid
    info = os.stat(state / "state.json")
    assert (info.st_uid, info.st_mode & 0o777) == (0, 0o600)

    # An operator's instance runs as mtc and may hold everyone's runs.
    for job_id in ("21", "22"):
        assert (
            opal["client"].post(f"/clusters/{ISO_ID}/jobs/{job_id}/tensorboard/").status_code == 302
        )
    seen = run_names(wait_for_runs(opal["client"], {ada_run, bob_run}, prefix=ISO_PREFIX))
    assert seen == {ada_run, bob_run}
    assert uid_of(tensorboard.tensorboard_get(ISO_ID, viewer=opal["user"]).pid) == os.geteuid()

    # The idle stop and the cluster's stop reach every instance.
    pids = [board.pid, bobs.pid]
    assert tensorboard.tensorboard_stop(ISO_ID)
    assert not any(procs.is_running(pid) for pid in pids)


def test_the_os_keeps_a_users_tensorboard_out_of_other_users_runs(isolated):
    """Even given Bob's log dir, a TensorBoard as Ada serves only what Ada may read."""
    import urllib.request

    from recipes import tensorboard_process

    ada = isolated["ada"]
    probe = settings.DATA_DIR / "tensorboard" / ISO_ID / "probe"
    own = tensorboard_process.own_dir(probe, ada["account"])
    # Bob's run first in the spec: it was walked before Ada's shows up.
    runs = {
        f"{n}-{name}": str(tensorboard.job_logdir(isolated[name]["job"]))
        for n, name in enumerate(("bob", "ada"))
    }
    pid, port = tensorboard_process.start(
        own, ada["account"], prefix="/probe", title="probe", runs=runs
    )
    try:
        assert uid_of(pid) == ada["account"].uid

        def listed() -> set[str] | None:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/probe/data/runs") as answer:
                names = run_names(json.loads(answer.read()))
            return names if "1-ada" in names else None

        assert wait_until(listed, what="ada's run listed", timeout=20) == {"1-ada"}
    finally:
        procs.stop([pid])
        tensorboard_process.reap_children()
