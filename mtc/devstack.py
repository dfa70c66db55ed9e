"""Starts and stops the processes of an mtc stack on this machine: Redis, Slurm
accounting (MariaDB + slurmdbd, mtc/accounting.py), Celery workers (+ beat), the web
server (gunicorn). Used by `make run`, the benchmarks and the tests
that need a real worker, so all three start things the same way."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

import redis

from mtc import accounting, firewall, redisauth
from mtc.secretfile import private_append, private_dir

BASE_DIR = Path(__file__).resolve().parent.parent
# Celery's queues (settings.CELERY_TASK_ROUTES): operations first, the default.
QUEUES = ("operations", "polls")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def unix_accounts_remove(low: int, high: int) -> None:
    """userdel/groupdel every account in [low, high]: what a bench run's private
    MTC_UID_RANGE made (local identity), so it leaves none behind."""
    import pwd

    for entry in pwd.getpwall():
        if low <= entry.pw_uid <= high:
            subprocess.run(["userdel", entry.pw_name], capture_output=True, check=False)
            subprocess.run(["groupdel", entry.pw_name], capture_output=True, check=False)


def port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.3)
        return sock.connect_ex((host, port)) == 0


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


@dataclass
class Stack:
    """A set of child processes sharing one environment (data dir, Redis, database)."""

    data_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    # The accounting dir this stack started (its daemons detach: stopped by pid file).
    accounting_dir: Path | None = None

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).resolve()
        # mtc's logs may name tokens and paths of every user: mtc's alone.
        private_dir(self.data_dir / "log")
        base = dict(os.environ)
        base.update(self.env)
        base["MTC_DATA_DIR"] = str(self.data_dir)
        base.setdefault("DJANGO_SETTINGS_MODULE", "mtc.settings")
        base.pop("MTC_CELERY_EAGER", None)
        self.env = base

    @property
    def python(self) -> str:
        return sys.executable

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = private_append(self.data_dir / "log" / f"{name}.log")  # owned by the child
        proc = subprocess.Popen(
            args,
            cwd=BASE_DIR,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def start_redis(self) -> str | None:
        """Start Redis for REDIS_URL unless one already answers there. Returns the URL.
        A URL without credentials gets mtc's own (mtc/redisauth.py): the server this
        starts lets nobody in without them."""
        url = self.env.get("REDIS_URL") or f"redis://127.0.0.1:{free_port()}/0"
        if not redisauth.has_credentials(url):
            url = redisauth.with_credentials(url, redisauth.redis_password(self.data_dir))
        self.env["REDIS_URL"] = url
        parsed = urlparse(url)
        host, port = parsed.hostname or "127.0.0.1", parsed.port or 6379
        if port_open(host, port):
            try:
                redis.Redis.from_url(url, socket_timeout=2).ping()
            except redis.RedisError as exc:
                raise RuntimeError(
                    f"a Redis already answers on {host}:{port} and does not take mtc's "
                    f"credentials ({exc}): stop it, or set REDIS_URL to one that does"
                ) from exc
            return url
        redis_dir = private_dir(self.data_dir / "redis")  # its queue holds task arguments
        config = redisauth.server_config(
            redis_dir / "redis.conf",
            port=port,
            password=unquote(parsed.password or ""),
            user=unquote(parsed.username or redisauth.REDIS_USER),
            directory=redis_dir,
        )
        self._start("redis", ["redis-server", str(config)])
        wait_for(lambda: port_open(host, port), 10, f"Redis on port {port}")
        return url

    def start_accounting(self, port: int) -> str:
        """MariaDB + munged + slurmdbd in ``$MTC_DATA_DIR/accounting`` (or
        MTC_ACCOUNTING_DIR), slurmdbd on 127.0.0.1:``port``; the children learn it
        from MTC_SLURMDBD_PORT. Returns what to print; on failure the stack runs on
        without accounting (local clusters then have none) and says why."""
        root = Path(self.env.get("MTC_ACCOUNTING_DIR") or self.data_dir / "accounting")
        try:
            accounting.start(root, dbd_port=port)
        except (accounting.AccountingError, OSError) as exc:
            accounting.stop(root)  # what did start of it
            self.env.pop("MTC_SLURMDBD_PORT", None)
            return f"accounting did not start ({exc}): clusters run without it"
        self.accounting_dir = root
        self.env.update(MTC_SLURMDBD_PORT=str(port), MTC_ACCOUNTING_DIR=str(root))
        return f"slurmdbd on 127.0.0.1:{port}, MariaDB and logs in {root}"

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.python, "manage.py", *args],
            cwd=BASE_DIR,
            env=self.env,
            check=check,
            capture_output=True,
            text=True,
        )

    def start_worker(
        self,
        *,
        beat: bool = True,
        concurrency: int = 2,
        queues: tuple[str, ...] = QUEUES,
        name: str = "worker",
    ) -> subprocess.Popen:
        """A worker for ``queues`` (both by default; `make run` starts one per queue)."""
        args = [
            self.python,
            "-m",
            "celery",
            "-A",
            "mtc",
            "worker",
            "--loglevel=INFO",
            f"--concurrency={concurrency}",
            "--queues",
            ",".join(queues),
            "--hostname",
            f"{name}-{os.getpid()}@%h",
        ]
        if beat:
            schedule = private_dir(self.data_dir / "celery") / "celerybeat-schedule"
            args += ["--beat", "--schedule", str(schedule)]
        return self._start(name, args)

    def start_web(self, port: int) -> subprocess.Popen:
        """gunicorn, sized in mtc/gunicorn_conf.py (the systemd unit uses the same file)."""
        proc = self._start(
            "web",
            [
                self.python,
                "-m",
                "gunicorn",
                "--config",
                "python:mtc.gunicorn_conf",
                "--bind",
                f"127.0.0.1:{port}",
                "mtc.wsgi:application",
            ],
        )

        def answers() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"web server exited; see {self.data_dir / 'log' / 'web.log'}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    return True
            except OSError:
                return False

        wait_for(answers, 30, f"the web server on port {port}")
        # Where a firewall table of this installation exists, jobs are kept off this too.
        firewall.firewall_ports_add(firewall.table_for(self.data_dir), [port])
        return proc

    def firewall_ports(self, web_port: int) -> list[str]:
        """``--port`` arguments for `mtc firewall up`: the web server's and MariaDB's."""
        ports = [web_port]
        if self.accounting_dir is not None:
            mariadb = self.accounting_dir / "run" / "mariadb.port"
            if mariadb.exists():
                ports.append(int(mariadb.read_text()))
        return [arg for p in ports for arg in ("--port", str(p))]

    def stop(self, name: str, *, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def stop_all(self) -> None:
        # The web server first (no new work), Redis last (workers ack on their way out).
        for name in sorted(self.procs, key=lambda n: (n == "redis", n != "web")):
            self.stop(name)
        if self.accounting_dir is not None:
            accounting.stop(self.accounting_dir)
            self.accounting_dir = None

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()
