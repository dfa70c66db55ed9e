"""The node agent's reporting: POST with a bearer token to a local HTTP server in a thread."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from node.agent import mtc_agent as agent
from node.shim import inject, install

AGENT = Path(agent.__file__).resolve()


class Recorder:
    """A local HTTP endpoint: answers with the queued statuses (then 200), keeps each request."""

    def __init__(self, statuses=(), headers=None, answers=()):
        self.statuses = list(statuses)
        self.answers = list(answers)  # JSON bodies of the first 2xx answers
        self.extra_headers = headers or {}
        self.requests: list[dict] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                recorder.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": body}
                )
                status = recorder.statuses.pop(0) if recorder.statuses else 200
                answer = {"status": status}
                if status < 300 and recorder.answers:
                    answer = recorder.answers.pop(0)
                payload = json.dumps(answer).encode()
                self.send_response(status)
                for key, value in recorder.extra_headers.get(status, {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v1/health/reports/"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


REPORT = {"node": "n1", "time": 1.5, "agent_version": 1, "checks": []}


def _no_sleep(log: list):
    return log.append


def test_post_report_sends_bearer_token_and_json():
    with Recorder() as server:
        assert agent.post_report(server.url, "tok-123", REPORT, sleep=_no_sleep([])) == "ok"
    (req,) = server.requests
    assert req["path"] == "/api/v1/health/reports/"
    assert req["headers"]["Authorization"] == "Bearer tok-123"
    assert req["headers"]["Content-Type"] == "application/json"
    assert json.loads(req["body"]) == REPORT


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_4xx_is_permanent(status):
    slept: list = []
    with Recorder([status]) as server:
        assert agent.post_report(server.url, "t", REPORT, sleep=_no_sleep(slept)) == "permanent"
    assert len(server.requests) == 1 and slept == []


def test_5xx_and_429_are_retried_with_backoff():
    slept: list = []
    with Recorder([503, 429, 500], headers={429: {"Retry-After": "7"}}) as server:
        outcome = agent.post_report(
            server.url, "t", REPORT, retries=5, backoff=0.5, sleep=_no_sleep(slept)
        )
    assert outcome == "ok"
    assert len(server.requests) == 4
    assert slept == [0.5, 7.0, 2.0]  # 0.5 * 2**n, or Retry-After


def test_redirect_is_not_followed():
    with Recorder([302], headers={302: {"Location": "http://127.0.0.1:9/elsewhere"}}) as server:
        assert agent.post_report(server.url, "t", REPORT, sleep=_no_sleep([])) == "permanent"
    assert len(server.requests) == 1


def test_connection_refused_is_retried_then_given_up():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    slept: list = []
    outcome = agent.post_report(
        f"http://127.0.0.1:{port}/r", "t", REPORT, retries=2, backoff=1.0, sleep=_no_sleep(slept)
    )
    assert outcome == "failed" and slept == [1.0, 2.0]


# --- through the CLI ----------------------------------------------------------------------


@pytest.fixture
def node(tmp_path) -> Path:
    node_dir = tmp_path / "n1"
    install.install(node_dir, 4, "NVIDIA_H100_80GB")
    config = json.loads((node_dir / "agent.json").read_text())
    config.update({"report_retries": 1, "report_backoff_s": 0.05, "report_timeout_s": 5})
    (node_dir / "agent.json").write_text(json.dumps(config))
    return node_dir


def run_cli(node_dir: Path, *args: str, env_extra=None) -> subprocess.CompletedProcess:
    # A plain python3 first on PATH for the shim scripts (not a slow wrapper script).
    pybin = node_dir / "pybin"
    if not pybin.exists():
        pybin.mkdir()
        (pybin / "python3").symlink_to(os.path.realpath(sys.executable))
    env = dict(os.environ, PATH=f"{pybin}{os.pathsep}{os.environ.get('PATH', '')}")
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-S", str(AGENT), "--node", "n1", "--config", str(node_dir / "agent.json")]
        + ["--once", "--checks", "disk,xid", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_cli_posts_the_report(node):
    with Recorder() as server:
        proc = run_cli(node, "--report-url", server.url, "--token", "s3cret")
    assert proc.returncode == 0, proc.stderr
    (req,) = server.requests
    assert req["headers"]["Authorization"] == "Bearer s3cret"
    assert req["headers"]["Content-Type"] == "application/json"
    body = json.loads(req["body"])
    assert body == json.loads(proc.stdout)
    assert body["node"] == "n1" and [c["name"] for c in body["checks"]] == ["disk", "xid"]


def test_cli_token_from_file_or_environment(node, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    with Recorder() as server:
        run_cli(node, "--report-url", server.url, "--token-file", str(token_file))
        run_cli(node, "--report-url", server.url, env_extra={"MTC_AGENT_TOKEN": "from-env"})
    assert [r["headers"]["Authorization"] for r in server.requests] == [
        "Bearer from-file",
        "Bearer from-env",
    ]


def test_cli_401_is_permanent_and_logged(node):
    with Recorder([401, 401, 401]) as server:
        proc = run_cli(node, "--report-url", server.url, "--token", "wrong")
    assert len(server.requests) == 1
    assert "HTTP 401" in proc.stderr and "permanent" in proc.stderr
    assert proc.returncode == 0  # the exit status is the node's health
    assert json.loads(proc.stdout)["node"] == "n1"


def test_undelivered_xid_is_reported_again(node):
    inject.inject(node, "xid", code=79, gpu=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_url = f"http://127.0.0.1:{s.getsockname()[1]}/r"
    first = run_cli(node, "--report-url", dead_url, "--token", "t")
    assert "not delivered" in first.stderr
    with Recorder() as server:
        second = run_cli(node, "--report-url", server.url, "--token", "t")
        third = run_cli(node, "--report-url", server.url, "--token", "t")
    codes = [
        [f["code"] for c in json.loads(p.stdout)["checks"] for f in c["findings"]]
        for p in (first, second, third)
    ]
    assert codes == [["XID_79"], ["XID_79"], []]


def test_cli_rejects_non_http_urls(node):
    proc = run_cli(node, "--report-url", "file:///etc/passwd", "--token", "t")
    assert proc.returncode == 2 and "http" in proc.stderr
