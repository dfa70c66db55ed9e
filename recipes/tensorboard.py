"""One TensorBoard process per (cluster, viewer), started on demand, bound to 127.0.0.1
and reachable only through mtc's proxy view, which passes a signed-in person to their
own instance alone (the URL is the same for everyone; the instance is chosen by who asks).

A user's instance runs as their own account (identity.runas) and serves only their own
jobs' runs, so the OS itself keeps it out of other users' 0700 run dirs; an operator's
runs as mtc and may serve any run of the cluster. Its state lives on disk, so that every
web and worker process finds the same one:

    DATA_DIR/tensorboard/<cluster_id>/<viewer>/    mtc's (0711), <viewer> "all" or "u<pk>"
        tensorboard.pid   the process id (checked against its command line and uid)
        state.json        {"port", "uid", "runs": {run name: log dir}, "job_pks", "started"}
        last_access       its mtime is the last request the proxy passed on
        lock              flock'ed while a process is started or stopped
        own/              the account's (0700): tensorboard.log, HOME and TMPDIR

mtc's files are 0600 and the account cannot write them, so it cannot point the proxy at
another port. The runs an instance serves only grow: opening another job restarts it with
the old runs and the new one; the beat task tensorboards_stop_idle stops it once nobody
looked for a while.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from clusters.choices import ClusterState
from clusters.models import Cluster
from clusters.providers import procs
from identity.services import account_ensure
from jobs.models import Job
from mtc import firewall, userfs

from . import tensorboard_process as process
from .tensorboard_process import TensorBoardError

__all__ = ["TensorBoard", "TensorBoardError", "tensorboard_get", "tensorboard_open"]

DEFAULT_IDLE_S = 15 * 60
RUN_NAME_UNSAFE_RE = re.compile(r"[^A-Za-z0-9._-]+")
VIEWER_KEY_RE = re.compile(r"all|u[0-9]+")
OPERATORS = "all"


@dataclass
class TensorBoard:
    cluster_id: str
    viewer: str
    pid: int
    port: int
    runs: dict[str, str] = field(default_factory=dict)
    job_pks: list[int] = field(default_factory=list)
    uid: int | None = None  # the account it runs as: the proxy talks only to its socket

    @property
    def prefix(self) -> str:
        return tensorboard_prefix(self.cluster_id)


# --- names and places ------------------------------------------------------------------
def tensorboard_prefix(cluster_id: str) -> str:
    """The URL path TensorBoard serves under, the same on its port and through mtc."""
    return f"/clusters/{cluster_id}/tensorboard"


def viewer_key(viewer) -> str:
    """Whose instance: operators share the cluster-wide one, each user has their own."""
    return OPERATORS if viewer.is_staff else f"u{viewer.pk}"


def idle_seconds() -> float:
    return float(getattr(settings, "MTC_TENSORBOARD_IDLE_S", DEFAULT_IDLE_S))


def _root() -> Path:
    return Path(settings.DATA_DIR) / "tensorboard"


def _state_dir(cluster_id: str, key: str) -> Path:
    return _root() / cluster_id / key


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


def _title(cluster_id: str, key: str) -> str:
    return f"mtc · {cluster_id} · {key}"


# --- reading the state --------------------------------------------------------------------
def _marker(cluster_id: str, key: str) -> str:
    # The argument only this instance has (NUL ends each cmdline argument).
    return f"--window_title={_title(cluster_id, key)}\0"


def _read_state(directory: Path) -> dict:
    try:
        state = json.loads((directory / "state.json").read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _get(cluster_id: str, key: str) -> TensorBoard | None:
    directory = _state_dir(cluster_id, key)
    pid = procs.daemon_pid(directory / "tensorboard.pid", _marker(cluster_id, key))
    state = _read_state(directory)
    if pid is None or not isinstance(state.get("port"), int):
        return None
    if state.get("uid") is not None and process.process_uid(pid) != state["uid"]:
        return None  # the pid is reused by somebody else's process
    return TensorBoard(
        cluster_id=cluster_id,
        viewer=key,
        pid=pid,
        port=state["port"],
        runs=dict(state.get("runs") or {}),
        job_pks=list(state.get("job_pks") or []),
        uid=state.get("uid") if isinstance(state.get("uid"), int) else None,
    )


def tensorboard_get(cluster_id: str, *, viewer) -> TensorBoard | None:
    """The viewer's running TensorBoard on the cluster, if its pid really is that one."""
    return _get(cluster_id, viewer_key(viewer))


def tensorboard_touch(board: TensorBoard) -> None:
    """Record an access (the idle stop reads the file's mtime)."""
    try:
        os.utime(_state_dir(board.cluster_id, board.viewer) / "last_access")
    except FileNotFoundError:
        pass


def _last_access(directory: Path) -> float:
    for name in ("last_access", "state.json"):
        try:
            return (directory / name).stat().st_mtime
        except OSError:
            continue
    return 0.0


@contextmanager
def _locked(cluster_id: str, key: str) -> Iterator[Path]:
    """One starter or stopper at a time per instance, across processes."""
    directory = _state_dir(cluster_id, key)
    for above in (_root(), directory.parent, directory):
        userfs.dir_pass(above)  # the account passes through to own/
    fd = os.open(directory / "lock", os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield directory
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# --- starting and stopping ----------------------------------------------------------------
def _stop_locked(directory: Path, cluster_id: str, key: str) -> bool:
    pid = procs.daemon_pid(directory / "tensorboard.pid", _marker(cluster_id, key))
    if pid is not None:
        procs.stop([pid], timeout=10)
        process.reap_children()
    port = _read_state(directory).get("port")
    if isinstance(port, int):
        firewall.firewall_ports_remove(firewall.table_for(settings.DATA_DIR), [port])
    for name in ("tensorboard.pid", "state.json", "last_access"):
        (directory / name).unlink(missing_ok=True)
    return pid is not None


def _viewer_account(viewer):
    """Who the instance runs as: mtc for operators, else the viewer's own account (mtc's
    in single-user mode). Raises IdentityMissing."""
    return None if viewer.is_staff else account_ensure(user=viewer)


def tensorboard_open(*, cluster: Cluster, jobs: Iterable[Job], viewer) -> TensorBoard:
    """The viewer's TensorBoard on the cluster serving at least these jobs' runs (a user's
    own jobs only): the running one when it has them all, else a new one with its runs
    and these (the old one is stopped)."""
    mine = [job for job in jobs if viewer.is_staff or job.owner_id == viewer.pk]
    wanted = {run_name(job): (str(logdir), job.pk) for job in mine if (logdir := job_logdir(job))}
    cluster_id, key = cluster.cluster_id, viewer_key(viewer)
    account = _viewer_account(viewer)
    with _locked(cluster_id, key) as directory:
        current = _get(cluster_id, key)
        if current and all(current.runs.get(n) == d for n, (d, _pk) in wanted.items()):
            tensorboard_touch(current)
            return current
        runs = dict(current.runs) if current else {}
        job_pks = set(current.job_pks) if current else set()
        for name, (logdir, pk) in wanted.items():
            runs[name] = logdir
            job_pks.add(pk)
        if not runs:
            raise TensorBoardError("None of these jobs is a recipe run of yours with event files.")
        _stop_locked(directory, cluster_id, key)
        own = process.own_dir(directory, account)
        pid, port = process.start(
            own,
            account,
            prefix=tensorboard_prefix(cluster_id),
            title=_title(cluster_id, key),
            runs=runs,
        )
        uid = account.uid if account is not None else os.geteuid()
        state = {
            "port": port,
            "uid": uid,
            "runs": runs,
            "job_pks": sorted(job_pks),
            "started": time.time(),
        }
        _write(directory / "state.json", json.dumps(state, indent=2))
        _write(directory / "tensorboard.pid", f"{pid}\n")
        _write(directory / "last_access", "")
        # TensorBoard has no sign-in: jobs' accounts are kept off its port (mtc/firewall.py),
        # and only mtc's proxy reaches it.
        firewall.firewall_ports_add(firewall.table_for(settings.DATA_DIR), [port])
        return TensorBoard(cluster_id, key, pid, port, runs, sorted(job_pks), uid)


def _instances(cluster_id: str) -> list[str]:
    directory = _root() / cluster_id
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if VIEWER_KEY_RE.fullmatch(p.name))


def _stop(cluster_id: str, key: str) -> bool:
    with _locked(cluster_id, key) as directory:
        return _stop_locked(directory, cluster_id, key)


def tensorboard_stop(cluster_id: str) -> bool:
    """Stop every TensorBoard of the cluster and forget them; True if one was running."""
    return any([_stop(cluster_id, key) for key in _instances(cluster_id)])


def tensorboard_stop_on_delete(sender, *, cluster_id: str, **kwargs) -> None:
    """The cluster_deleting receiver: its TensorBoards, if they run, stop with it."""
    tensorboard_stop(cluster_id)


def tensorboards_stop_idle(*, idle_s: float) -> list[str]:
    """Stop every TensorBoard nobody used for idle_s seconds, and those of clusters that
    are gone or being deleted; forget the state of processes that died. Returns the
    instances stopped, as "<cluster_id>/<viewer>"."""
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
        for key in _instances(cluster_id):
            directory = _state_dir(cluster_id, key)
            running = _get(cluster_id, key) is not None
            if running and cluster_id in live and now - _last_access(directory) < idle_s:
                continue
            if _stop(cluster_id, key):
                stopped.append(f"{cluster_id}/{key}")
        if cluster_id not in live:
            with contextlib.suppress(OSError):  # users' own/ folders inside: by descriptor
                userfs.remove(root / cluster_id)
    return stopped
