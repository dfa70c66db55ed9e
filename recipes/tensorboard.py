"""One TensorBoard process per cluster, started on demand, bound to 127.0.0.1 and
reachable only through mtc's proxy view (which requires a signed-in user).

Its state lives on disk so that every web and worker process finds the same one:

    DATA_DIR/tensorboard/<cluster_id>/
        tensorboard.pid   the process id (checked against its command line before use)
        state.json        {"port", "runs": {run name: log dir}, "job_pks", "started"}
        last_access       its mtime is the last request the proxy passed on
        lock              flock'ed while a process is started or stopped
        tensorboard.log   the process's own output

The runs it serves only grow: opening another job restarts it with the old runs and
the new one; the beat task tensorboards_stop_idle stops it once nobody looked for a while.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from clusters.choices import ClusterState
from clusters.models import Cluster
from clusters.providers import procs
from jobs.models import Job
from mtc.devstack import free_port, port_open

DEFAULT_IDLE_S = 15 * 60
START_TIMEOUT_S = 30.0
START_ATTEMPTS = 2  # a second try on a new port if another process took the first
RELOAD_INTERVAL_S = 5  # how often TensorBoard looks for new event files
RUN_NAME_UNSAFE_RE = re.compile(r"[^A-Za-z0-9._-]+")


class TensorBoardError(Exception):
    """TensorBoard could not be started (its log's last lines say why)."""


@dataclass
class TensorBoard:
    cluster_id: str
    pid: int
    port: int
    runs: dict[str, str] = field(default_factory=dict)
    job_pks: list[int] = field(default_factory=list)

    @property
    def prefix(self) -> str:
        return tensorboard_prefix(self.cluster_id)


# --- names and places ------------------------------------------------------------------
def tensorboard_prefix(cluster_id: str) -> str:
    """The URL path TensorBoard serves under, the same on its port and through mtc."""
    return f"/clusters/{cluster_id}/tensorboard"


def idle_seconds() -> float:
    return float(getattr(settings, "MTC_TENSORBOARD_IDLE_S", DEFAULT_IDLE_S))


def _root() -> Path:
    return Path(settings.DATA_DIR) / "tensorboard"


def _state_dir(cluster_id: str) -> Path:
    return _root() / cluster_id


def job_logdir(job: Job) -> Path | None:
    """A recipe run writes its event files to <run_dir>/tb; checkpoint_dir is
    <run_dir>/checkpoints."""
    if not job.recipe or not job.checkpoint_dir:
        return None
    logdir = Path(job.checkpoint_dir).parent / "tb"
    # --logdir_spec separates runs with commas: a path holding one cannot be given.
    if not logdir.is_absolute() or "," in str(logdir):
        return None
    return logdir


def run_name(job: Job) -> str:
    """`<job_id>-<job name>`, without the ':' and ',' that --logdir_spec reserves."""
    name = RUN_NAME_UNSAFE_RE.sub("-", job.name).strip("-")[:60]
    return f"{job.job_id}-{name}" if name else job.job_id


# --- reading the state --------------------------------------------------------------------
def _marker(cluster_id: str) -> str:
    # The argument only this cluster's TensorBoard has (NUL ends each cmdline argument).
    return f"--path_prefix={tensorboard_prefix(cluster_id)}\0"


def _read_state(cluster_id: str) -> dict:
    try:
        state = json.loads((_state_dir(cluster_id) / "state.json").read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def tensorboard_get(cluster_id: str) -> TensorBoard | None:
    """The cluster's running TensorBoard, if its pid really is that TensorBoard."""
    directory = _state_dir(cluster_id)
    pid = procs.daemon_pid(directory / "tensorboard.pid", _marker(cluster_id))
    state = _read_state(cluster_id)
    if pid is None or not isinstance(state.get("port"), int):
        return None
    return TensorBoard(
        cluster_id=cluster_id,
        pid=pid,
        port=state["port"],
        runs=dict(state.get("runs") or {}),
        job_pks=list(state.get("job_pks") or []),
    )


def tensorboard_touch(cluster_id: str) -> None:
    """Record an access (the idle stop reads the file's mtime)."""
    try:
        os.utime(_state_dir(cluster_id) / "last_access")
    except FileNotFoundError:
        pass


def _last_access(cluster_id: str) -> float:
    directory = _state_dir(cluster_id)
    for name in ("last_access", "state.json"):
        try:
            return (directory / name).stat().st_mtime
        except OSError:
            continue
    return 0.0


@contextmanager
def _locked(cluster_id: str) -> Iterator[Path]:
    """One starter or stopper at a time per cluster, across processes."""
    directory = _state_dir(cluster_id)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield directory
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# --- starting and stopping ----------------------------------------------------------------
def _command(cluster_id: str, port: int, runs: dict[str, str]) -> list[str]:
    spec = ",".join(f"{name}:{logdir}" for name, logdir in sorted(runs.items()))
    return [
        sys.executable,
        "-m",
        "tensorboard.main",  # the venv's own module: works wherever mtc's Python does
        f"--logdir_spec={spec}",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--path_prefix={tensorboard_prefix(cluster_id)}",
        f"--reload_interval={RELOAD_INTERVAL_S}",
        f"--window_title=mtc · {cluster_id}",
    ]


def _log_tail(directory: Path, lines: int = 5) -> str:
    try:
        text = (directory / "tensorboard.log").read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(text.strip().splitlines()[-lines:])


# The processes this process started: kept so that exited ones are collected (no zombies)
# and not reported as left running when the interpreter ends.
_children: dict[int, subprocess.Popen] = {}


def _reap_children() -> None:
    for pid, process in list(_children.items()):
        if process.poll() is not None:
            del _children[pid]


def _start(directory: Path, cluster_id: str, runs: dict[str, str]) -> tuple[int, int]:
    for _attempt in range(START_ATTEMPTS):
        port = free_port()
        with open(directory / "tensorboard.log", "wb") as log:
            # Its own session: a web process that restarts (or a Ctrl-C) leaves it running,
            # and the pid file lets the next process find it.
            process = subprocess.Popen(
                _command(cluster_id, port, runs),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=directory,
                start_new_session=True,
            )
        _children[process.pid] = process
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and process.poll() is None:
            if port_open("127.0.0.1", port):
                return process.pid, port
            time.sleep(0.1)
        if process.poll() is None:  # still not listening: give up on it
            procs.stop([process.pid], timeout=5)
        process.wait(timeout=5)
        _reap_children()
    raise TensorBoardError(f"TensorBoard did not start: {_log_tail(directory) or 'no output'}")


def _stop_locked(directory: Path, cluster_id: str) -> bool:
    pid = procs.daemon_pid(directory / "tensorboard.pid", _marker(cluster_id))
    if pid is not None:
        procs.stop([pid], timeout=10)
        _reap_children()
    for name in ("tensorboard.pid", "state.json", "last_access"):
        (directory / name).unlink(missing_ok=True)
    return pid is not None


def tensorboard_open(*, cluster: Cluster, jobs: Iterable[Job]) -> TensorBoard:
    """The cluster's TensorBoard serving at least these jobs' runs: the running one when
    it has them all, else a new one with its runs and these (the old one is stopped)."""
    wanted = {run_name(job): (str(logdir), job.pk) for job in jobs if (logdir := job_logdir(job))}
    cluster_id = cluster.cluster_id
    with _locked(cluster_id) as directory:
        current = tensorboard_get(cluster_id)
        if current and all(current.runs.get(n) == d for n, (d, _pk) in wanted.items()):
            tensorboard_touch(cluster_id)
            return current
        runs = dict(current.runs) if current else {}
        job_pks = set(current.job_pks) if current else set()
        for name, (logdir, pk) in wanted.items():
            runs[name] = logdir
            job_pks.add(pk)
        if not runs:
            raise TensorBoardError("None of these jobs is a recipe run with event files.")
        _stop_locked(directory, cluster_id)
        pid, port = _start(directory, cluster_id, runs)
        state = {"port": port, "runs": runs, "job_pks": sorted(job_pks), "started": time.time()}
        (directory / "state.json").write_text(json.dumps(state, indent=2))
        (directory / "tensorboard.pid").write_text(f"{pid}\n")
        (directory / "last_access").touch()
        return TensorBoard(cluster_id, pid, port, runs, sorted(job_pks))


def tensorboard_stop(cluster_id: str) -> bool:
    """Stop the cluster's TensorBoard and forget it; True if one was running."""
    if not _state_dir(cluster_id).is_dir():
        return False
    with _locked(cluster_id) as directory:
        return _stop_locked(directory, cluster_id)


def tensorboard_stop_on_delete(sender, *, cluster_id: str, **kwargs) -> None:
    """The cluster_deleting receiver: its TensorBoard, if it runs, stops with it."""
    tensorboard_stop(cluster_id)


def tensorboards_stop_idle(*, idle_s: float) -> list[str]:
    """Stop every TensorBoard nobody used for idle_s seconds, and those of clusters that
    are gone or being deleted; forget the state of processes that died. Returns the
    clusters whose TensorBoard was stopped."""
    root = _root()
    if not root.is_dir():
        return []
    cluster_ids = sorted(p.name for p in root.iterdir() if p.is_dir())
    live = set(
        Cluster.objects.filter(cluster_id__in=cluster_ids)
        .exclude(state=ClusterState.DELETING)
        .values_list("cluster_id", flat=True)
    )
    stopped, now = [], time.time()
    for cluster_id in cluster_ids:
        running = tensorboard_get(cluster_id) is not None
        if running and cluster_id in live and now - _last_access(cluster_id) < idle_s:
            continue
        if tensorboard_stop(cluster_id):
            stopped.append(cluster_id)
        if cluster_id not in live:
            shutil.rmtree(_state_dir(cluster_id), ignore_errors=True)
    return stopped
