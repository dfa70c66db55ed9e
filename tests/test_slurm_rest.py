"""Submitting through slurmrestd (slurm/rest.py): the option mapping, the job
environment, error mapping and the fall back to sbatch against a stand-in daemon on a
unix socket, then the same job from both paths on a real local cluster."""

from __future__ import annotations

import glob
import json
import os
import socketserver
import stat
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from slurm import SlurmClient, SlurmError
from slurm import rest as slurm_rest
from slurm.rest import RestUnsuitable, check_script, job_description, sbatch_environment
from slurm.submit import Submission, sbatch_args

from .conftest import cluster_root, make_spec

SCRIPT = "#!/bin/bash\ntrue\n"
ALL_OPTIONS = Submission(
    name="sweep",
    script=SCRIPT,
    partition="gpu",
    nodes=2,
    ntasks_per_node=4,
    gpus_per_node=8,
    cpus_per_task=3,
    time_limit="1-02:03",
    env={"GREETING": "hi"},
    requeue=False,
    dependency="afterok:12,singleton",
    array="0-3%2",
)


def answer(status: int, **body) -> tuple[int, dict]:
    return status, {"meta": {}, "errors": [], **body}


class FakeRestd:
    """A stand-in slurmrestd on a unix socket: answers each request with the next
    canned (status, body), or drops the connection unanswered for None; records the
    requests and counts connections. ``close_after`` closes each kept-alive
    connection once it answered, as a restarted daemon would."""

    def __init__(self, path: str, answers: list, *, close_after: bool = False):
        self.path, self.answers, self.requests, self.connections = path, list(answers), [], 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive

            def setup(self):
                fake.connections += 1
                super().setup()

            def do_POST(self):  # noqa: N802 (http.server's naming)
                length = int(self.headers["Content-Length"])
                fake.requests.append((self.path, json.loads(self.rfile.read(length))))
                self._answer()

            def do_GET(self):  # noqa: N802
                fake.requests.append((self.path, None))
                self._answer()

            def _answer(self):
                reply = fake.answers.pop(0)
                if reply is None:
                    self.close_connection = True
                    return
                status, body = reply
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                self.close_connection = close_after

            def log_message(self, *args):
                pass

        self.server = socketserver.ThreadingUnixStreamServer(path, Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self) -> FakeRestd:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        slurm_rest.drop_connections()


@pytest.fixture
def sock(tmp_path) -> str:
    slurm_rest.drop_connections()
    return str(tmp_path / "rest.sock")


@pytest.fixture
def sbatch_calls(monkeypatch) -> list:
    """SlurmClient.run replaced: records what sbatch would have been given."""
    calls = []

    def fake_run(self, args, **kwargs):
        calls.append((args, kwargs))
        return subprocess.CompletedProcess(args, 0, stdout="77\n", stderr="")

    monkeypatch.setattr(SlurmClient, "run", fake_run)
    return calls


def args_for(sub: Submission, work: str = "/w") -> list[str]:
    return sbatch_args(sub, output_dir="/out", work_dir=work, comment="mtc-owner=uma")


# --- mapping --------------------------------------------------------------------
def test_every_submit_option_maps_to_its_rest_field():
    job = job_description(args_for(ALL_OPTIONS), {"A": "1"})
    assert job == {
        "name": "sweep",
        "nodes": "2",
        "tasks_per_node": "4",
        "cpus_per_task": "3",
        "standard_output": "/out/slurm-%A_%a.out",
        "standard_error": "/out/slurm-%A_%a.err",
        "current_working_directory": "/w",
        "comment": "mtc-owner=uma",
        "no_requeue": True,
        "open_mode": "append",
        "partition": "gpu",
        "gpus_per_node": "8",
        "time_limit": "1-02:03",
        "dependency": "afterok:12,singleton",
        "array": "0-3%2",
        "environment": {"A": "1"},
    }
    plain = job_description(args_for(Submission(name="a", script=SCRIPT)) + ["--hold"], {})
    assert plain["requeue"] is True and plain["hold"] is True
    assert "no_requeue" not in plain and "partition" not in plain
    assert plain["standard_output"] == "/out/slurm-%j.out"


def test_what_rest_cannot_express_goes_to_sbatch():
    with pytest.raises(RestUnsuitable):
        job_description(["sbatch", "--exclusive"], {})
    with pytest.raises(RestUnsuitable):
        job_description(["sbatch", "--mem=4G"], {})
    for script in (
        "#!/bin/bash\n#SBATCH --mem=4G\ntrue\n",
        "#!/bin/bash\n  #PBS -l walltime=1:00\ntrue\n",
        "#!/bin/bash\r\ntrue\r\n",
    ):
        with pytest.raises(RestUnsuitable):
            check_script(script)
    check_script("#!/bin/bash\necho '#SBATCH is only text here' # sbatch agrees\n")


def test_job_environment_gets_what_sbatch_adds():
    old = os.umask(0o027)
    try:
        env = sbatch_environment(args_for(ALL_OPTIONS, "/work"), "/work")
    finally:
        os.umask(old)
    assert env["SLURM_CPUS_PER_TASK"] == "3"
    assert env["SLURM_NTASKS_PER_NODE"] == "4"
    assert env["SLURM_NTASKS"] == env["SLURM_NPROCS"] == "8"
    assert env["SLURM_GPUS_PER_NODE"] == "8"
    assert env["SLURM_SUBMIT_DIR"] == "/work"
    assert env["SLURM_UMASK"] == "0027"
    assert {k for k in env if k.startswith("SLURM_RLIMIT_")} == {
        f"SLURM_RLIMIT_{n}" for n in slurm_rest.RLIMITS
    }
    assert all(v.isdigit() for k, v in env.items() if k.startswith("SLURM_RLIMIT_"))
    cpu_only = sbatch_environment(args_for(Submission(name="a", script=SCRIPT)), "/w")
    assert "SLURM_GPUS_PER_NODE" not in cpu_only and cpu_only["SLURM_NTASKS"] == "1"


# --- the client against a stand-in slurmrestd -------------------------------------
def test_submit_posts_the_job_and_reuses_one_connection(sock, sbatch_calls, tmp_path):
    answers = [answer(200, job_id=41, step_id="BATCH"), answer(200, job_id=42, step_id="BATCH")]
    client = SlurmClient("/etc/slurm.conf", rest_socket=sock)
    args = args_for(ALL_OPTIONS, str(tmp_path))
    with FakeRestd(sock, answers) as fake:
        assert client.submit(args, SCRIPT, {"GREETING": "hi", "MTC_CLUSTER": "c"}) == "41"
        assert client.submit(args, SCRIPT, {}) == "42"
    assert fake.connections == 1 and not sbatch_calls
    path, body = fake.requests[0]
    assert path == "/slurm/v0.0.38/job/submit" and body["script"] == SCRIPT
    environment = body["job"]["environment"]
    assert environment["GREETING"] == "hi" and environment["MTC_CLUSTER"] == "c"
    assert environment["SLURM_CONF"] == "/etc/slurm.conf"
    assert environment["SLURM_SUBMIT_DIR"] == str(tmp_path)
    assert environment["PATH"] == os.environ["PATH"]
    # Exactly: this process's PATH/locale/TZ, the user's, SLURM_CONF, sbatch's own.
    assert set(environment) == {
        *(k for k in ("PATH", "LANG", "LC_ALL", "TZ") if k in os.environ),
        "GREETING",
        "MTC_CLUSTER",
        "SLURM_CONF",
        *sbatch_environment(args, str(tmp_path)),
    }


def test_a_connection_closed_while_idle_is_replaced(sock, sbatch_calls):
    answers = [answer(200, job_id=5), answer(200, job_id=6)]
    client = SlurmClient("/etc/slurm.conf", rest_socket=sock)
    with FakeRestd(sock, answers, close_after=True) as fake:
        assert client.submit(["sbatch", "--job-name=a"], SCRIPT, {}) == "5"
        time.sleep(0.05)
        assert client.submit(["sbatch", "--job-name=a"], SCRIPT, {}) == "6"
    assert fake.connections == 2 and not sbatch_calls


def test_notes_with_an_accepted_job_are_not_errors(sock, sbatch_calls):
    held = answer(200, job_id=9, errors=[{"error_code": 2042, "error": "Job is in held state"}])
    with FakeRestd(sock, [held]):
        assert SlurmClient("/c", rest_socket=sock).submit(["sbatch", "--hold"], SCRIPT, {}) == "9"


@pytest.mark.parametrize(
    "code, error",
    [
        (1800, "Unable to contact slurm controller (connect failure)"),
        (1008, "Socket timed out on send/recv operation"),
    ],
)
def test_a_controller_not_answering_is_transient(sock, sbatch_calls, code, error):
    refused = answer(500, errors=[{"error_code": code, "error": error}])
    with FakeRestd(sock, [refused]), pytest.raises(SlurmError) as caught:
        SlurmClient("/c", rest_socket=sock).submit(["sbatch", "--job-name=a"], SCRIPT, {})
    assert str(caught.value) == f"Batch job submission failed: {error}"
    assert not caught.value.permanent and not sbatch_calls


@pytest.mark.parametrize(
    "reply",
    [
        # Slurm refused: sbatch words it as users know it (with the controller's reason).
        answer(500, errors=[{"error_code": 2000, "error": "Invalid partition name specified"}]),
        # sbatch waits and retries these itself.
        answer(500, errors=[{"error_code": 2007, "error": "Unable to create job record"}]),
        # slurmrestd did not take the request (mapping, parsing, auth).
        answer(400, errors=[{"description": 'Unknown key "x"'}, {"error_code": 9001}]),
        answer(401, errors=[{"error_code": 1, "error": "Authentication failure"}]),
    ],
)
def test_requests_rest_did_not_take_go_to_sbatch(sock, sbatch_calls, reply, tmp_path):
    args = args_for(Submission(name="a", script=SCRIPT), str(tmp_path))
    with FakeRestd(sock, [reply]):
        assert SlurmClient("/c", rest_socket=sock).submit(args, SCRIPT, {"X": "1"}) == "77"
    [(sbatch, kwargs)] = sbatch_calls
    assert sbatch == args and kwargs["stdin"] == SCRIPT and kwargs["cwd"] == str(tmp_path)
    assert kwargs["env"]["X"] == "1" and kwargs["env"]["SLURM_CONF"] == "/c"


def test_no_slurmrestd_means_sbatch(sock, sbatch_calls):
    assert SlurmClient("/c", rest_socket=sock).submit(["sbatch"], SCRIPT, {}) == "77"
    Path(sock).touch()  # a stale socket file nobody listens on
    assert SlurmClient("/c", rest_socket=sock).submit(["sbatch"], SCRIPT, {}) == "77"
    assert SlurmClient("/c").submit(["sbatch"], SCRIPT, {}) == "77"
    assert len(sbatch_calls) == 3


def test_scripts_with_directives_go_to_sbatch(sock, sbatch_calls):
    with FakeRestd(sock, []) as fake:
        client = SlurmClient("/c", rest_socket=sock)
        assert client.submit(["sbatch"], "#!/bin/bash\n#SBATCH --mem=1G\ntrue\n", {}) == "77"
    assert not fake.requests and len(sbatch_calls) == 1


def test_an_unanswered_submit_is_transient_and_not_resent(sock, sbatch_calls):
    with FakeRestd(sock, [None]) as fake, pytest.raises(SlurmError) as caught:
        SlurmClient("/c", rest_socket=sock).submit(["sbatch", "--job-name=a"], SCRIPT, {})
    # The job may exist: neither sbatch nor a second POST may submit it again.
    assert not caught.value.permanent and len(fake.requests) == 1 and not sbatch_calls


# --- a real cluster ----------------------------------------------------------------
def stored_environment(cluster_id: str, job_id: str) -> set[str]:
    """The environment slurmctld stored for a job (its state dir)."""
    state = cluster_root(cluster_id) / "state"
    [path] = glob.glob(str(state / "hash.*" / f"job.{job_id}" / "environment"))
    return {v.decode() for v in Path(path).read_bytes().split(b"\0") if b"=" in v}


def show_job(client: SlurmClient, job_id: str) -> set[str]:
    out = client.run(["scontrol", "show", "job", job_id]).stdout.split("\n\n")[0]
    varying = ("JobId=", "ArrayJobId=", "SubmitTime=", "EligibleTime=", "AllocNode:Sid=")
    return {f.replace(f"-{job_id}_", "-N_") for f in out.split() if not f.startswith(varying)}


@pytest.mark.slurm
def test_both_paths_make_the_same_job_on_a_real_cluster(local_clusters, user, tmp_path):
    from clusters import services as cluster_services
    from clusters.models import Cluster
    from clusters.providers import get_provider

    cluster_services.cluster_create(spec=make_spec("rs", nodes=2))
    cluster = Cluster.objects.get(cluster_id="rs")
    provider = get_provider("local")
    sock = provider.rest_socket(cluster)
    assert provider._slurmrestd_pid(cluster)
    # slurmrestd (as its own unprivileged user) makes the socket; the directory it sits
    # in is that user's alone, so no job's user can reach it.
    socket_dir = os.stat(os.path.dirname(sock))
    assert stat.S_IMODE(socket_dir.st_mode) == 0o700
    assert socket_dir.st_uid == os.stat(sock).st_uid != os.getuid()
    rest = provider.slurm(cluster)
    sbatch = SlurmClient(rest.conf_path)

    args = args_for(ALL_OPTIONS, str(tmp_path)) + ["--hold"]
    env = {"GREETING": "hi there", "MTC_CLUSTER": "rs"}
    by_sbatch, by_rest = sbatch.submit(args, SCRIPT, env), rest.submit(args, SCRIPT, env)
    assert stored_environment("rs", by_rest) == stored_environment("rs", by_sbatch)
    assert show_job(rest, by_rest) == show_job(sbatch, by_sbatch)

    for bad in (["--partition=nope"], ["--gpus-per-node=99"]):
        messages = []
        for client in (sbatch, rest):
            with pytest.raises(SlurmError) as caught:
                client.submit(["sbatch", "--parsable", *bad], SCRIPT, {})
            messages.append((str(caught.value), caught.value.permanent))
        assert messages[0] == messages[1] and messages[0][1], messages

    # The API goes through slurmrestd (test_api_jobs.py runs its jobs that way).
    api = APIClient()
    api.force_authenticate(user)
    log = cluster_root("rs") / "log" / "slurmrestd.log"
    posts = log.read_text().count("POST /slurm/v0.0.38/job/submit")
    body = {"name": "r", "script": SCRIPT, "env": {"GREETING": "hi"}}
    response = api.post("/api/v1/clusters/rs/jobs", body, format="json")
    assert response.status_code == 201, response.content
    assert log.read_text().count("POST /slurm/v0.0.38/job/submit") == posts + 1

    # A slurmrestd that dies is started again by the 10-second recovery round.
    provider._stop_slurmrestd(cluster)
    assert not provider._slurmrestd_pid(cluster)
    from clusters.operations import clusters_restore

    clusters_restore()
    assert provider._slurmrestd_pid(cluster) and rest.submit(["sbatch", "--hold"], SCRIPT, {})

    provider.stop_cluster(cluster)
    assert not provider._slurmrestd_pid(cluster)
    provider.apply(cluster, list(cluster.nodes.select_related("pool")))
    assert provider._slurmrestd_pid(cluster) and rest.submit(["sbatch", "--hold"], SCRIPT, {})
    provider.delete_cluster(cluster)
    assert not Path(sock).exists()
