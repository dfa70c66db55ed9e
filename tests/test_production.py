"""The production control plane: `check --deploy` clean with MTC_PRODUCTION=1, gunicorn
serving pages and static files, and Celery's two queues (polls, operations)."""

from __future__ import annotations

import http.client
import json
import logging
import os
import subprocess
import sys
import urllib.request

import pytest
from celery._state import _task_stack
from django.conf import settings

from mtc import gunicorn_conf
from mtc.celery import app
from mtc.devstack import BASE_DIR, Stack, free_port

PRODUCTION_ENV = {
    "MTC_PRODUCTION": "1",
    "MTC_ALLOWED_HOSTS": "mtc.example.com",
    "MTC_SECRET_KEY": "k3Y-" + "x7Qa9zR2mN5pL8wE4tY6uI1oP3aS0dF" * 2,
}


def _run(tmp_path, code_or_args: list[str], extra: dict[str, str]):
    # The browser tests set DJANGO_ALLOW_ASYNC_UNSAFE in this process (Playwright beside
    # the ORM); a deployment never has it, and check --deploy says so.
    skip = ("MTC_PRODUCTION", "MTC_HSTS", "DJANGO_ALLOW_ASYNC_UNSAFE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(skip)}
    env.update(extra, MTC_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="mtc.settings")
    return subprocess.run(
        [sys.executable, *code_or_args],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_is_clean_in_production(tmp_path):
    done = _run(
        tmp_path, ["manage.py", "check", "--deploy", "--fail-level", "WARNING"], PRODUCTION_ENV
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


def test_production_settings(tmp_path):
    code = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        "print(json.dumps({k: getattr(s, k) for k in ('DEBUG', 'SESSION_COOKIE_SECURE', "
        "'CSRF_COOKIE_SECURE', 'SECURE_SSL_REDIRECT', 'SECURE_HSTS_SECONDS', "
        "'SECURE_PROXY_SSL_HEADER', 'ALLOWED_HOSTS', 'WHITENOISE_USE_FINDERS')}))"
    )
    extra = {"MTC_DEBUG": "1", "MTC_PUBLIC_URL": "http://127.0.0.1:8000"}
    done = _run(tmp_path, ["-c", code], {**PRODUCTION_ENV, **extra})
    assert done.returncode == 0, done.stderr
    values = json.loads(done.stdout)
    assert values["DEBUG"] is False  # MTC_DEBUG cannot turn it on in production
    assert values["SESSION_COOKIE_SECURE"] and values["CSRF_COOKIE_SECURE"]
    assert values["SECURE_SSL_REDIRECT"] and values["SECURE_HSTS_SECONDS"] >= 31536000
    assert values["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    # Node agents post to MTC_PUBLIC_URL (loopback by default): mtc answers there too.
    assert values["ALLOWED_HOSTS"] == ["mtc.example.com", "127.0.0.1"]
    assert values["WHITENOISE_USE_FINDERS"] is False


def test_production_needs_allowed_hosts(tmp_path):
    env = {k: v for k, v in PRODUCTION_ENV.items() if k != "MTC_ALLOWED_HOSTS"}
    env["MTC_ALLOWED_HOSTS"] = ""
    done = _run(tmp_path, ["manage.py", "check"], env)
    assert done.returncode != 0 and "MTC_ALLOWED_HOSTS" in done.stderr


def test_gunicorn_serves_pages_and_static_files(tmp_path):
    port = free_port()
    env = {"MTC_CELERY_EAGER": "1", "MTC_WEB_KEEPALIVE_REQUESTS": "3"}
    with Stack(tmp_path, env=env) as stack:
        proc = stack.start_web(port)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            assert r.read() == b"ok" and r.headers["Server"].startswith("gunicorn")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/static/mtc.css", timeout=5) as r:
            assert r.status == 200 and "max-age" in r.headers["Cache-Control"]  # WhiteNoise
        # One kept-alive connection carries MTC_WEB_KEEPALIVE_REQUESTS requests, then the
        # server closes it (and the client reconnects on its own).
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        said = []
        for _ in range(4):
            connection.request("GET", "/healthz")
            response = connection.getresponse()
            assert response.read() == b"ok"
            said.append((response.getheader("Connection") or "keep-alive").lower())
        connection.close()
        assert said == ["keep-alive", "keep-alive", "close", "keep-alive"]
    assert proc.poll() is not None  # the stack stopped it


class FakeWorker:
    def __init__(self, pid: int, connections: int) -> None:
        self.pid, self.nr_conns = pid, connections
        self.log = logging.getLogger("fake-worker")


class FakeRequest:
    method, path, req_number, must_close = "GET", "/healthz", 2, False


def test_a_web_process_holding_more_than_its_share_of_connections_closes_one():
    busy, light = FakeWorker(990001, 9), FakeWorker(990002, 3)
    for worker in (busy, light):
        gunicorn_conf.post_worker_init(worker)
    try:
        busy_request, light_request = FakeRequest(), FakeRequest()
        gunicorn_conf.pre_request(busy, busy_request)
        gunicorn_conf.pre_request(light, light_request)
        assert not light_request.must_close  # 3 of 12: under its share of 6
        assert busy_request.must_close  # 9 of 12: its client reconnects, maybe elsewhere
        busy.nr_conns = 5  # within one of the mean (4): it keeps its connections
        even = FakeRequest()
        gunicorn_conf.pre_request(busy, even)
        assert not even.must_close
    finally:
        for worker in (busy, light):
            gunicorn_conf.child_exit(None, worker)
    assert not {busy.pid, light.pid} & set(gunicorn_conf._held[0::2])  # slots freed


def _queue(name: str) -> str:
    return app.amqp.router.route({}, name)["queue"].name


def test_every_beat_task_exists_and_goes_to_the_polls_queue():
    # As a worker starts: every app's tasks module (alone, this test would see only those
    # some earlier test happened to import).
    app.loader.import_default_modules()
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        assert entry["task"] in app.tasks, entry["task"]
        assert _queue(entry["task"]) == "polls", entry["task"]


@pytest.mark.parametrize(
    "name",
    [
        "clusters.tasks.operation_run",  # create, delete, resize, repair
        "registry.tasks.version_export_run",
        "serving.tasks.endpoint_reconcile",  # a user's endpoint change
    ],
)
def test_operations_go_to_the_operations_queue(name):
    assert name in app.tasks
    assert _queue(name) == "operations"


def test_a_polls_fan_out_stays_on_the_polls_queue():
    _task_stack.push(app.tasks["serving.tasks.endpoints_reconcile_all"])
    try:
        assert _queue("serving.tasks.endpoint_reconcile") == "polls"
        assert _queue("clusters.tasks.operation_run") == "operations"
    finally:
        _task_stack.pop()
    _task_stack.push(app.tasks["recipes.tasks.recipe_metrics_ingest_all"])
    try:  # a hang check timed to a job's threshold is part of the recipe round
        assert _queue("recipes.tasks.recipe_hang_check") == "polls"
    finally:
        _task_stack.pop()
    _task_stack.push(app.tasks["clusters.tasks.clusters_reconcile_all"])
    try:  # a poll that resumes an operation sends it where operations run
        assert _queue("clusters.tasks.operation_run") == "operations"
    finally:
        _task_stack.pop()
