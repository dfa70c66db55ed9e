"""Starting one TensorBoard process: as the viewer's account (or as mtc for operators),
from an argument list, with an allowlisted environment, its log and temp files in a
folder of the account's own (0700) that mtc opens without following links."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from clusters.providers import procs
from identity.runas import Account, popen_as
from mtc import userfs
from mtc.devstack import free_port

START_TIMEOUT_S = 30.0
START_ATTEMPTS = 2  # a second try on a new port if another process took the first
RELOAD_INTERVAL_S = 5  # how often TensorBoard looks for new event files
LOG_NAME = "tensorboard.log"
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp
LOCALHOST_HEX = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it


class TensorBoardError(Exception):
    """TensorBoard could not be started (its log's last lines say why)."""


# The processes this process started: kept so that exited ones are collected (no zombies)
# and not reported as left running when the interpreter ends.
_children: dict[int, subprocess.Popen] = {}


def reap_children() -> None:
    for pid, process in list(_children.items()):
        if process.poll() is not None:
            del _children[pid]


def own_dir(directory: Path, account: Account | None) -> Path:
    """The instance's folder for the process itself (its log, HOME and TMPDIR): the
    account's alone. Its parent is mtc's, so the account cannot swap it for a link."""
    userfs.dir_pass(directory)
    return userfs.dir_own(directory / "own", account)


def command(*, prefix: str, title: str, port: int, runs: dict[str, str]) -> list[str]:
    spec = ",".join(f"{name}:{logdir}" for name, logdir in sorted(runs.items()))
    return [
        sys.executable,
        "-m",
        "tensorboard.main",  # the venv's own module: works wherever mtc's Python does
        f"--logdir_spec={spec}",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--path_prefix={prefix}",
        f"--reload_interval={RELOAD_INTERVAL_S}",
        f"--window_title={title}",
    ]


def _environment(own: Path) -> dict[str, str]:
    # Nothing of mtc's environment (secrets, database URLs) reaches a user's process;
    # TensorBoard's info files go to its own TMPDIR, not a shared /tmp/.tensorboard-info.
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(own),
        "TMPDIR": str(own),
        "LANG": "C.UTF-8",
        "PYTHONNOUSERSITE": "1",
    }


def _open_log(own: Path, account: Account | None) -> int:
    """A fresh log file: removed and made anew, never through a link the account left."""
    return userfs.create(own / LOG_NAME, account=account)


def log_tail(own: Path, uid: int, lines: int = 5) -> str:
    """The last lines of the log, read only if it is a plain file of the instance's uid
    (the account could have left a link to something it may not read in its place)."""
    try:
        with userfs.open_read(own / LOG_NAME, owner=uid) as log:
            text = log.read(64 * 1024).decode(errors="replace")
    except OSError:
        return ""
    return " | ".join(text.strip().splitlines()[-lines:])


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def serves_port(pid: int, port: int) -> bool:
    """Whether ``pid`` itself listens on 127.0.0.1:port: a port merely open could be
    another user's process that took it first, which must never get this viewer's
    requests."""
    wanted = f"{LOCALHOST_HEX}:{port:04X}"
    try:
        rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    listening = {f[9] for row in rows if (f := row.split())[1] == wanted and f[3] == LISTEN}
    return bool(listening & _socket_inodes(pid))


def process_uid(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def start(
    own: Path, account: Account | None, *, prefix: str, title: str, runs: dict[str, str]
) -> tuple[int, int]:
    """Start TensorBoard and wait until it listens; returns (pid, port)."""
    uid = account.uid if account is not None else os.geteuid()
    for _attempt in range(START_ATTEMPTS):
        port = free_port()
        argv = command(prefix=prefix, title=title, port=port, runs=runs)
        log = _open_log(own, account)
        try:
            # Its own session: a web process that restarts (or a Ctrl-C) leaves it
            # running, and the pid file lets the next process find it.
            kw = dict(
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=own,
                env=_environment(own),
                start_new_session=True,
            )
            process = popen_as(account, argv, **kw) if account else subprocess.Popen(argv, **kw)
        finally:
            os.close(log)
        _children[process.pid] = process
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and process.poll() is None:
            if serves_port(process.pid, port):
                return process.pid, port
            time.sleep(0.1)
        if process.poll() is None:  # still not listening: give up on it
            procs.stop([process.pid], timeout=5)
        process.wait(timeout=5)
        reap_children()
    raise TensorBoardError(f"TensorBoard did not start: {log_tail(own, uid) or 'no output'}")
