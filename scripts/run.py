"""`make run`: migrate, make sure an admin exists, collect static files, start Redis,
Slurm accounting (MariaDB + slurmdbd; MTC_SLURMDBD_PORT, default 6829, 0 for none), two
Celery workers (operations; polls, with beat) and gunicorn, create the demo
cluster if there is none, and stop what it started on Ctrl-C or SIGTERM. Local clusters
keep running: they are the machines, and the next `make run` finds them (`make
stop-clusters` stops them)."""

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mtc.devstack import BASE_DIR, Stack  # noqa: E402
from mtc.redisauth import without_credentials  # noqa: E402


def main() -> int:
    data_dir = Path(os.environ.get("MTC_DATA_DIR", BASE_DIR / "var"))
    port = int(os.environ.get("MTC_PORT", "8000"))
    env = {"REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6389/0")}
    stack = Stack(data_dir, env=env)
    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True
        print(f"mtc: {signal.Signals(signum).name} received")

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        print(f"mtc: data in {stack.data_dir}")
        stack.manage("migrate", "--noinput", "-v0")
        stack.manage("collectstatic", "--noinput", "-v0")  # WhiteNoise serves STATIC_ROOT
        bootstrap = stack.manage("mtc", "bootstrap")
        print(bootstrap.stdout, end="")
        stack.start_redis()
        print(f"mtc: Redis at {without_credentials(stack.env['REDIS_URL'])}")
        dbd_port = int(os.environ.get("MTC_SLURMDBD_PORT", "6829") or 0)
        if dbd_port:
            print(f"mtc: accounting: {stack.start_accounting(dbd_port)}")
        else:
            print("mtc: accounting off (MTC_SLURMDBD_PORT=0): clusters run without it")
        # One worker per queue: a slow poll never holds up a create, delete or repair.
        stack.start_worker(name="worker-operations", queues=("operations",), beat=False)
        stack.start_worker(name="worker-polls", queues=("polls",), beat=True)
        stack.start_web(port)
        # Jobs run on this host as their owners: keep their accounts off Redis, the web
        # server, MariaDB and a local PostgreSQL (mtc/firewall.py; says so when it cannot).
        firewall = stack.manage("mtc", "firewall", "up", *stack.firewall_ports(port), check=False)
        print("mtc: " + (firewall.stdout + firewall.stderr).strip())
        contained = stack.manage("mtc", "cgroups", check=False)
        print("mtc: " + (contained.stdout + contained.stderr).strip())
        demo = stack.manage("mtc", "demo", check=False)
        print(demo.stdout + demo.stderr, end="")
        print(f"\nmtc is running at http://127.0.0.1:{port}/  (API docs: /api/docs/)")
        print(f"logs: {stack.data_dir / 'log'}   Ctrl-C stops the stack\n")
        parent = os.getppid()
        while not stopping:
            if os.getppid() != parent:  # `make` was killed: it does not pass signals on
                stopping = True
            for name, proc in list(stack.procs.items()):
                if proc.poll() is not None:
                    print(f"mtc: {name} exited ({proc.returncode}); see {stack.data_dir}/log")
                    stopping = True
            time.sleep(0.5)
    finally:
        print("mtc: stopping web, workers, Redis and accounting ...")
        stack.manage("mtc", "firewall", "down", check=False)
        stack.stop_all()
        print("mtc: stopped. Local clusters keep running; `make stop-clusters` stops them.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
