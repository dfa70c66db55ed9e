"""A Celery worker killed in the middle of a create: the next worker finishes it
with exactly the nodes asked for (real Redis, real worker, real Slurm)."""

import signal
import time

import pytest
from django.conf import settings as django_settings

from clusters import services
from clusters.models import Cluster, Node, Operation
from clusters.providers import get_provider
from mtc.devstack import Stack

from .conftest import cluster_processes, database_url, make_spec, sinfo_json
from .waiting import wait_until

pytestmark = pytest.mark.slurm


def _wait(predicate, timeout: float, what: str):
    return wait_until(predicate, timeout=timeout, what=what)


def _slurmd_count(cluster_id: str) -> int:
    count = 0
    for pid in cluster_processes(cluster_id):
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            if fh.read().split(b"\0")[0].endswith(b"slurmd"):
                count += 1
    return count


def test_killed_worker_mid_create_is_finished_by_the_next(transactional_db, settings, tmp_path):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    env = {
        "REDIS_URL": django_settings.REDIS_URL,
        "DATABASE_URL": database_url(),
        "MTC_DATA_DIR": str(django_settings.DATA_DIR),
    }
    slow = Stack(django_settings.DATA_DIR, env={**env, "MTC_OPERATION_STEP_DELAY": "1.5"})
    slow.data_dir = tmp_path  # worker logs go to the test's own folder
    (tmp_path / "log").mkdir()
    fresh = None
    try:
        slow.start_worker(beat=False, concurrency=1)
        operation = services.cluster_create(spec=make_spec("wk", nodes=4))
        # Daemons started, nodes not yet confirmed: kill the worker there.
        _wait(lambda: Operation.objects.get(pk=operation.pk).progress >= 70, 60, "progress 70")
        slow.stop("worker", sig=signal.SIGKILL)
        op = Operation.objects.get(pk=operation.pk)
        assert op.state == "RUNNING" and Cluster.objects.get(cluster_id="wk").state == "CREATING"

        fresh = Stack(django_settings.DATA_DIR, env=env)
        fresh.data_dir = tmp_path
        fresh.start_worker(beat=False, concurrency=1)
        op = _wait(
            lambda: Operation.objects.filter(pk=operation.pk, state="SUCCEEDED").first(),
            60,
            "the operation to succeed after the restart",
        )
        assert op.attempts == 2
        cluster = Cluster.objects.get(cluster_id="wk")
        assert cluster.state == "RUNNING"
        assert Node.objects.filter(cluster=cluster).count() == 4
        assert sinfo_json("wk") == {f"wk-gpu-{i}": "idle" for i in range(4)}
        assert _slurmd_count("wk") == 4
    finally:
        slow.stop_all()
        if fresh:
            fresh.stop_all()
        for cluster in Cluster.objects.all():
            get_provider(cluster.provider).delete_cluster(cluster)


def test_a_hung_squeue_delays_no_create_or_delete(transactional_db, settings, tmp_path):
    """Polls and operations have their own queues and workers: a job poll stuck on an
    squeue that never answers holds up neither a create nor a delete."""
    import os

    from jobs.tasks import jobs_poll_all

    settings.CELERY_TASK_ALWAYS_EAGER = False
    standin = tmp_path / "bin"
    standin.mkdir()
    # Blocks opening a FIFO nobody writes: it hangs in its own process (no child to
    # outlive it) until SlurmClient's timeout kills it.
    os.mkfifo(standin / "never")
    (standin / "squeue").write_text(f"#!/bin/sh\nread line < {standin / 'never'}\n")
    (standin / "squeue").chmod(0o755)
    env = {
        "REDIS_URL": django_settings.REDIS_URL,
        "DATABASE_URL": database_url(),
        "MTC_DATA_DIR": str(django_settings.DATA_DIR),
    }
    hung_path = f"{standin}:{os.environ['PATH']}"
    stacks = [
        Stack(django_settings.DATA_DIR, env={**env, "PATH": hung_path}),
        Stack(django_settings.DATA_DIR, env=env),
    ]
    for stack in stacks:
        stack.data_dir = tmp_path  # worker logs go to the test's own folder
    (tmp_path / "log").mkdir()
    try:
        stacks[0].start_worker(beat=False, concurrency=1, queues=("polls",), name="polls")
        stacks[1].start_worker(beat=False, concurrency=1, queues=("operations",), name="ops")
        first = services.cluster_create(spec=make_spec("hq", nodes=1))
        _wait(lambda: Operation.objects.filter(pk=first.pk, state="SUCCEEDED").exists(), 90, "hq")
        for _ in range(4):  # each hangs until SlurmClient's 15 s timeout: a minute stuck
            jobs_poll_all.delay()
        _wait(lambda: "squeue" in _children_of("polls", stacks[0]), 30, "the poll to hang")

        started = time.monotonic()
        second = services.cluster_create(spec=make_spec("hr", nodes=1))
        _wait(lambda: Operation.objects.filter(pk=second.pk, state="SUCCEEDED").exists(), 60, "hr")
        assert "squeue" in _children_of("polls", stacks[0])  # the polls worker still stuck
        gone = services.cluster_delete(cluster=Cluster.objects.get(cluster_id="hq"))
        _wait(lambda: Operation.objects.filter(pk=gone.pk, state="SUCCEEDED").exists(), 60, "rm")
        assert time.monotonic() - started < 60
    finally:
        for stack in stacks:
            stack.stop_all()
        for cluster in Cluster.objects.all():
            get_provider(cluster.provider).delete_cluster(cluster)


def _children_of(name: str, stack: Stack) -> str:
    """The command names of every process under a stack's worker."""
    import subprocess

    root = stack.procs[name].pid
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,comm="], capture_output=True, text=True)
    parents: dict[int, list[tuple[int, str]]] = {}
    for line in out.stdout.splitlines():
        pid, ppid, comm = line.split(None, 2)
        parents.setdefault(int(ppid), []).append((int(pid), comm))
    names, todo = [], [root]
    while todo:
        for pid, comm in parents.get(todo.pop(), []):
            names.append(comm)
            todo.append(pid)
    return " ".join(names)
