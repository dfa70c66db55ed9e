"""gunicorn's settings for mtc's web server: `make run` (mtc/devstack.py) and the systemd
unit (deploy/mtc-web.service) both start `gunicorn -c python:mtc.gunicorn_conf`.

MTC_BIND         where to listen (default 127.0.0.1:$MTC_PORT: the TLS proxy is in front)
MTC_WEB_WORKERS  processes (default: one per core)
MTC_WEB_THREADS  threads per process (default 6)
MTC_WEB_KEEPALIVE_REQUESTS  requests on one kept-alive connection before it is closed
                 (default 1000; 0: no limit)
MTC_WEB_NICE     the server's CPU priority, -20..19 (default -5, as root; see mtc/cpu.py)
"""

import gc
import multiprocessing
import os

bind = os.environ.get("MTC_BIND", f"127.0.0.1:{os.environ.get('MTC_PORT', '8000')}")

# gthread: one process per core runs Python in parallel past the GIL; the threads in
# each overlap what a request waits on (SQLite/PostgreSQL, Redis, a submit through
# slurmrestd or sbatch, a TensorBoard or replica stream), which is most of its time.
# 4-8 threads keep a core busy without piling up database locks; more would only
# queue on SQLite's one writer. Idle keep-alive connections wait in the poller, not in
# a thread, and a long stream cannot make the arbiter kill its worker: the main thread
# answers the heartbeat (a sync worker would be killed at `timeout`).
worker_class = "gthread"
workers = int(os.environ.get("MTC_WEB_WORKERS") or os.cpu_count() or 2)
threads = int(os.environ.get("MTC_WEB_THREADS", "6"))
# A kept-alive connection stays with the process that accepted it, and a busy client
# never idles out: bench/load.py saw 35 to 40 of 50 clients on one of two processes, whose
# clients waited twice as long, and a process that is busy wins most accepts (its main
# thread is awake when a client connects). So each process publishes how many
# connections it holds (a shared array, one slot a process), and one holding more than
# its share closes a connection after its response ("Connection: close"); the client
# reconnects (well under a millisecond on a local or the proxy's connection) and lands
# anywhere, until the shares even out. Like nginx's keepalive_requests, a connection
# is also closed after KEEPALIVE_REQUESTS requests.
keepalive = 5  # seconds an idle kept-alive connection stays open
KEEPALIVE_REQUESTS = int(os.environ.get("MTC_WEB_KEEPALIVE_REQUESTS", "1000"))
_SLOTS = 64  # processes at most; a process beyond them is not balanced
# Created here, in the master, so every forked worker shares it: (pid, connections).
_held = multiprocessing.Array("q", 2 * _SLOTS)
timeout = 60  # a worker whose main loop stalls this long is replaced
graceful_timeout = 10  # on SIGTERM, requests in flight get this long to finish
# The app (Django, DRF, every view) is loaded once, in the master: a worker is a fork
# that serves at once. Loading it per worker costs ~1.5 s of CPU, and on two cores a
# worker booting while the other carries every connection was the API's slowest second.
# A code update therefore needs a restart (systemctl restart mtc-web), not a HUP.
preload_app = True
# A worker is replaced after about this many requests, so whatever it grew is given
# back: at ~150 requests/s a worker about every 6 minutes (each replacement closes its
# kept-alive connections, which then reconnect).
max_requests = 50000
max_requests_jitter = 5000
# Logs go to stdout/stderr: journald under systemd, the stack's log/web.log under make run.
accesslog = "-"
# gunicorn's default line, plus how long each request took (ms): slow requests show up.
access_log_format = '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s" %(M)sms'
errorlog = "-"
loglevel = os.environ.get("MTC_LOG_LEVEL", "info").lower()
proc_name = "mtc-web"


def post_worker_init(worker):
    with _held.get_lock():
        for slot in range(_SLOTS):
            if _held[2 * slot] == 0:
                _held[2 * slot], _held[2 * slot + 1] = worker.pid, 0
                worker.mtc_slot = slot
                return


def child_exit(server, worker):  # in the master (which never saw the slot): free it
    with _held.get_lock():
        for slot in range(_SLOTS):
            if _held[2 * slot] == worker.pid:
                _held[2 * slot], _held[2 * slot + 1] = 0, 0


def more_than_its_share(worker) -> bool:
    """Whether this process holds over one connection more than the processes' mean."""
    held = getattr(worker, "nr_conns", None)  # gthread's count (a sync worker has none)
    slot = getattr(worker, "mtc_slot", None)
    if held is None or slot is None:
        return False
    # Every request comes here: the raw array, not the locked wrapper (which takes the
    # lock on each item). A count read mid-write only shifts one decision.
    raw = _held.get_obj()
    raw[2 * slot + 1] = held
    counts = [count for pid, count in zip(raw[0::2], raw[1::2], strict=True) if pid]
    return held > sum(counts) / len(counts) + 1


def pre_request(worker, req):
    worker.log.debug("%s %s", req.method, req.path)  # gunicorn's own hook does this
    if (KEEPALIVE_REQUESTS and req.req_number >= KEEPALIVE_REQUESTS) or more_than_its_share(worker):
        req.must_close = True  # the response says "Connection: close"


def on_starting(server):
    # Before the workers fork: they share the master's session, and with it its priority.
    from mtc import cpu

    cpu.priority_set(os.getpid(), int(os.environ.get("MTC_WEB_NICE", "-5")))


def when_ready(server):
    # In the master, before the first fork: import every view now (Django loads the
    # URLconf on the first request otherwise), so each worker starts with all of it.
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018
    # Move those ~130k objects out of the collector's sight, for the master and every
    # worker it forks: a full collection otherwise walks them all, stalling every thread
    # of a worker for ~90 ms every few seconds under load (~7 ms once they are frozen),
    # and touching them would copy the pages the workers share with the master.
    gc.freeze()
