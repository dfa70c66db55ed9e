"""Slurm accounting for one mtc installation: a private MariaDB, a munged with the
accounting key, and one slurmdbd that serves every local cluster (each registered
under its own ClusterName, as multi-cluster sites do).

Everything lives in one directory (``$MTC_DATA_DIR/accounting`` for `make run`, the
test run's own dir for `make test`): ``db/`` (MariaDB's data), ``etc/`` (slurmdbd.conf,
munge.key, the database password), ``run/`` (sockets, pid files), ``log/``. Nothing
system-wide: MariaDB listens on 127.0.0.1 at a free port and its own socket, slurmdbd on
127.0.0.1 at ``dbd_port``.

Munge: each local cluster has its own munged and key, so no cluster can forge another's
credentials. slurmdbd has one key, so it gets its own munged; a cluster's slurm.conf
names that munged's socket in AccountingStoragePass, which Slurm uses for the
slurmctld <-> slurmdbd (and sacct/sacctmgr <-> slurmdbd) messages only, the way
multi-cluster sites keep one "global" munged beside each cluster's own.

Run as a script (scripts/test.sh): ``python -m mtc.accounting start DIR PORT`` /
``stop DIR``.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from mtc.secretfile import private_append, private_dir, secret_create, secret_write

# What Slurm keeps from users about each other: slurmdbd.conf here, every slurm.conf
# mtc writes (slurm/config.py, the gce bootstrap) likewise. Root (mtc) sees everything.
PRIVATE_DATA = "jobs,usage,users,accounts"

DB_NAME = "slurm_acct_db"
DB_USER = "slurm"


class AccountingError(RuntimeError):
    pass


def munge_socket(root: Path) -> str:
    """The accounting munged's socket (a short path when the dir's is too long)."""
    path = str(Path(root).resolve() / "run" / "munge.sock")
    if len(path) < 100:  # AF_UNIX paths are limited to 108 bytes
        return path
    return f"/tmp/mtc-acct-munge-{hashlib.sha1(path.encode()).hexdigest()[:16]}.sock"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.3)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return pid


def _wait(predicate, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AccountingError(f"{what} did not start in {timeout:g}s; see {log}")
        time.sleep(0.1)


def _run(args: list[str], log: Path, **kwargs) -> None:
    with private_append(log) as out:
        proc = subprocess.run(
            args, stdin=subprocess.DEVNULL, stdout=out, stderr=out, check=False, **kwargs
        )
    if proc.returncode != 0:
        raise AccountingError(f"{args[0]} exited {proc.returncode}; see {log}")


def _dirs(root: Path) -> dict[str, Path]:
    root = Path(root).resolve()
    private_dir(root, 0o711)
    return {
        "root": root,
        "etc": private_dir(root / "etc"),
        # Users' sacct reaches the munge socket by its path; nothing here is listed.
        "run": private_dir(root / "run", 0o711),
        "log": private_dir(root / "log"),
    }


def _start_munged(d: dict[str, Path]) -> None:
    key = d["etc"] / "munge.key"
    secret_create(key, os.urandom(1024), mode=0o400)
    if _pid(d["run"] / "munged.pid"):
        return
    sock = munge_socket(d["root"])
    Path(sock).unlink(missing_ok=True)
    _run(
        [
            "munged",
            "--force",
            f"--socket={sock}",
            f"--key-file={key}",
            f"--log-file={d['log'] / 'munged.log'}",
            f"--pid-file={d['run'] / 'munged.pid'}",
            f"--seed-file={d['run'] / 'munged.seed'}",
        ],
        d["log"] / "daemons.out",
        start_new_session=True,
        timeout=30,
    )
    _wait(lambda: Path(sock).exists(), 5, "munged", d["log"] / "munged.log")


def _start_mariadb(d: dict[str, Path]) -> int:
    """Start the private MariaDB (installing its data dir the first time); its port."""
    datadir = d["root"] / "db"
    as_root = ["--user=root"] if os.geteuid() == 0 else []
    sock = d["run"] / "mysqld.sock"
    port_file = d["run"] / "mariadb.port"
    if _pid(d["run"] / "mariadbd.pid") and port_file.exists():
        return int(port_file.read_text())
    fresh = not (datadir / "mysql").exists()
    if fresh:
        private_dir(datadir)
        _run(
            [
                "mariadb-install-db",
                "--no-defaults",
                *as_root,
                f"--datadir={datadir}",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ],
            d["log"] / "mariadb-install.log",
            timeout=120,
        )
    port = _free_port()
    sock.unlink(missing_ok=True)
    with private_append(d["log"] / "daemons.out") as out:
        subprocess.Popen(
            [
                "mariadbd",
                "--no-defaults",
                *as_root,
                f"--datadir={datadir}",
                f"--socket={sock}",
                f"--port={port}",
                "--bind-address=127.0.0.1",
                f"--pid-file={d['run'] / 'mariadbd.pid'}",
                f"--log-error={d['log'] / 'mariadbd.log'}",
                "--skip-name-resolve",
                "--skip-log-bin",
                # Small: accounting for a few local clusters, on a laptop's memory.
                "--innodb-buffer-pool-size=64M",
                "--innodb-log-file-size=32M",
                "--innodb-lock-wait-timeout=900",
                # A crash may lose the last second of records; slurmctld resends them.
                "--innodb-flush-log-at-trx-commit=2",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    _wait(lambda: _port_open(port), 60, "MariaDB", d["log"] / "mariadbd.log")
    port_file.write_text(str(port))
    if fresh:
        password = secrets.token_hex(16)
        secret_write(d["etc"] / "db.pass", password)
        sql = (
            f"CREATE USER '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{password}';"
            f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';"
        )
        _run(
            ["mariadb", "--no-defaults", f"--socket={sock}", "-u", "root", "-e", sql],
            d["log"] / "mariadb-install.log",
            timeout=30,
        )
    return port


def _start_slurmdbd(d: dict[str, Path], *, db_port: int, dbd_port: int) -> None:
    pid_file = d["run"] / "slurmdbd.pid"
    if _pid(pid_file):
        return
    if _port_open(dbd_port):  # another installation's slurmdbd: its munge key is not ours
        raise AccountingError(f"port {dbd_port} is taken (set MTC_SLURMDBD_PORT)")
    user = pwd.getpwuid(os.geteuid()).pw_name
    password = (d["etc"] / "db.pass").read_text().strip()
    conf = "\n".join(
        [
            "# Written by mtc (mtc/accounting.py); rewritten at every start.",
            "AuthType=auth/munge",
            f"AuthInfo=socket={munge_socket(d['root'])}",
            "DbdHost=localhost",
            "DbdAddr=127.0.0.1",
            f"DbdPort={dbd_port}",
            f"SlurmUser={user}",
            f"PidFile={pid_file}",
            f"LogFile={d['log'] / 'slurmdbd.log'}",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            f"StoragePort={db_port}",
            f"StorageUser={DB_USER}",
            f"StoragePass={password}",
            f"StorageLoc={DB_NAME}",
            # sacct -a from a job lists only its own user's jobs (slurmdbd answers sacct).
            f"PrivateData={PRIVATE_DATA}",
            "",
        ]
    )
    # slurmdbd refuses a config others may read; it finds slurmdbd.conf beside SLURM_CONF.
    secret_write(d["etc"] / "slurmdbd.conf", conf)
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/bin"),
        "SLURM_CONF": str(d["etc"] / "slurm.conf"),
    }
    _run(["slurmdbd"], d["log"] / "daemons.out", env=env, start_new_session=True, timeout=60)
    _wait(lambda: _port_open(dbd_port), 60, "slurmdbd", d["log"] / "slurmdbd.log")


def start(root: Path | str, *, dbd_port: int) -> None:
    """Start MariaDB, the accounting munged and slurmdbd unless they run (idempotent)."""
    d = _dirs(Path(root))
    _start_munged(d)
    db_port = _start_mariadb(d)
    _start_slurmdbd(d, db_port=db_port, dbd_port=dbd_port)


def stop(root: Path | str) -> None:
    """Stop slurmdbd first (it flushes to MariaDB), then MariaDB, then munged."""
    run = Path(root).resolve() / "run"
    for name in ("slurmdbd", "mariadbd", "munged"):
        pid = _pid(run / f"{name}.pid")
        if pid is None:
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _pid(run / f"{name}.pid") == pid and time.monotonic() < deadline:
            time.sleep(0.1)
        if _pid(run / f"{name}.pid") == pid:
            os.kill(pid, signal.SIGKILL)
    Path(munge_socket(Path(root))).unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "start":
        start(argv[1], dbd_port=int(argv[2]))
        return 0
    if len(argv) == 2 and argv[0] == "stop":
        stop(argv[1])
        return 0
    print("usage: python -m mtc.accounting start DIR DBD_PORT | stop DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except AccountingError as exc:
        print(f"accounting: {exc}", file=sys.stderr)
        sys.exit(1)
