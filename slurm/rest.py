"""Submitting through slurmrestd, Slurm's own REST daemon, on a unix socket.

A submit through `sbatch` forks a process that parses slurm.conf and gets a munge
credential before it talks to slurmctld; slurmrestd has done all of that once, so a
submit is one HTTP request on a kept-alive connection. The job it makes is the one
`sbatch` would make from the same argument list: the options map one to one
(``job_description``), and the job's environment gets the variables sbatch adds to
its own (``sbatch_environment``). What REST cannot express (#SBATCH lines in the
script, an option with no mapping), what slurmrestd does not take, and a job Slurm
refuses (sbatch words the refusal with the controller's reason) go to sbatch
instead (``RestUnsuitable``): nothing was submitted then, so nothing is twice.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import resource
import select
import socket
import threading
from typing import Any

from .errors import TRANSIENT_MARKERS, SlurmError

log = logging.getLogger(__name__)

API = "/slurm/v0.0.38"  # the newest OpenAPI plugin Slurm 22.05 ships
SUBMIT_PATH = f"{API}/job/submit"
# sbatch option -> v0.0.38 job field; slurmrestd runs each value through the same
# option parser as sbatch, so the values pass as they are.
VALUE_FIELDS = {
    "--job-name": "name",
    "--nodes": "nodes",
    "--ntasks-per-node": "tasks_per_node",
    "--cpus-per-task": "cpus_per_task",
    "--gpus-per-node": "gpus_per_node",
    "--partition": "partition",
    "--account": "account",
    "--qos": "qos",
    "--time": "time_limit",
    "--dependency": "dependency",
    "--array": "array",
    "--output": "standard_output",
    "--error": "standard_error",
    "--open-mode": "open_mode",
    "--chdir": "current_working_directory",
    "--comment": "comment",
}
# Flags. v0.0.38 ignores the value of "requeue" (false still requeues), so
# --no-requeue needs its own key.
FLAG_FIELDS = {"--requeue": "requeue", "--no-requeue": "no_requeue", "--hold": "hold"}
IGNORED_FLAGS = {"--parsable"}  # sbatch's output format; REST answers JSON anyway
# sbatch reads these directives from the script; slurmrestd does not.
DIRECTIVE_RE = re.compile(r"^\s*#(SBATCH|PBS|BSUB)", re.MULTILINE)
RLIMITS = ("CPU", "FSIZE", "DATA", "STACK", "CORE", "RSS", "NPROC", "NOFILE", "MEMLOCK", "AS")
ULONG_MAX = 2**64 - 1  # how sbatch prints RLIM_INFINITY (%lu)


class RestUnavailable(Exception):
    """slurmrestd could not be reached; nothing was sent, so sbatch may submit."""


class RestUnsuitable(Exception):
    """This submission cannot go through REST as sbatch would take it; nothing was
    submitted, so sbatch may."""


# --- the request --------------------------------------------------------------
def option_values(args: list[str]) -> tuple[dict[str, str], set[str]]:
    """``--key=value`` options and bare flags of an sbatch argument list."""
    values: dict[str, str] = {}
    flags: set[str] = set()
    for arg in args[1:] if args and args[0] == "sbatch" else args:
        key, sep, value = arg.partition("=")
        if sep:
            values[key] = value
        else:
            flags.add(key)
    return values, flags


def job_description(args: list[str], environment: dict[str, str]) -> dict[str, Any]:
    """The v0.0.38 job for an sbatch argument list; RestUnsuitable for an option
    without a mapping (never drop one silently)."""
    values, flags = option_values(args)
    job: dict[str, Any] = {}
    for key, value in values.items():
        if key not in VALUE_FIELDS:
            raise RestUnsuitable(f"no REST mapping for {key}")
        job[VALUE_FIELDS[key]] = value
    for flag in flags - IGNORED_FLAGS:
        if flag not in FLAG_FIELDS:
            raise RestUnsuitable(f"no REST mapping for {flag}")
        job[FLAG_FIELDS[flag]] = True
    job["environment"] = environment
    return job


def check_script(script: str) -> None:
    """Scripts whose meaning sbatch would change or refuse go to sbatch."""
    if DIRECTIVE_RE.search(script):
        raise RestUnsuitable("the script carries #SBATCH/#PBS/#BSUB directives")
    if "\r\n" in script:
        raise RestUnsuitable("the script has DOS line breaks (sbatch refuses them)")


def _umask() -> int:
    # Reading it with os.umask() would set it for a moment in every thread.
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def sbatch_environment(args: list[str], submit_dir: str) -> dict[str, str]:
    """What sbatch 22.05 adds to the job's environment on its own (from its options,
    its process and its host), so a REST job gets the same."""
    values, _ = option_values(args)
    env: dict[str, str] = {}
    if "--cpus-per-task" in values:
        env["SLURM_CPUS_PER_TASK"] = values["--cpus-per-task"]
    if "--ntasks-per-node" in values:
        per_node = values["--ntasks-per-node"]
        env["SLURM_NTASKS_PER_NODE"] = per_node
        # sbatch derives the task count from nodes x tasks per node.
        nodes = values.get("--nodes", "1")
        if nodes.isdigit() and per_node.isdigit():
            env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = str(int(nodes) * int(per_node))
    if "--gpus-per-node" in values:
        env["SLURM_GPUS_PER_NODE"] = values["--gpus-per-node"]
    env["SLURM_PRIO_PROCESS"] = str(os.getpriority(os.PRIO_PROCESS, 0))
    env["SLURM_SUBMIT_DIR"] = submit_dir
    env["SLURM_SUBMIT_HOST"] = socket.gethostname()
    env["SLURM_UMASK"] = f"{_umask():04o}"
    # slurmstepd applies these limits to the job (PropagateResourceLimits=ALL).
    for name in RLIMITS:
        soft = resource.getrlimit(getattr(resource, f"RLIMIT_{name}"))[0]
        env[f"SLURM_RLIMIT_{name}"] = str(ULONG_MAX if soft == resource.RLIM_INFINITY else soft)
    return env


# --- the connection -----------------------------------------------------------
class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 over an AF_UNIX socket."""

    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


# One kept-alive connection per slurmrestd socket, per thread (http.client is not
# thread safe) and per process (a forked worker must not share its parent's).
_local = threading.local()


def _connections() -> dict[str, UnixHTTPConnection]:
    if getattr(_local, "pid", None) != os.getpid():
        _local.pid = os.getpid()
        _local.conns = {}
    return _local.conns


def _closed_by_peer(sock: socket.socket) -> bool:
    """A kept-alive socket that is readable while idle was closed by slurmrestd."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def drop_connections() -> None:
    for conn in _connections().values():
        conn.close()
    _connections().clear()


class RestClient:
    def __init__(
        self, socket_path: str, *, timeout: float = 15.0, headers: dict[str, str] | None = None
    ):
        self.socket_path = socket_path
        self.timeout = timeout
        # Authentication (X-SLURM-USER-NAME/-TOKEN) for slurmrestd's rest_auth/jwt.
        self.headers = headers or {}

    def _connection(self) -> tuple[UnixHTTPConnection, bool]:
        """A connected connection, and whether it served a request before."""
        conns = _connections()
        conn = conns.get(self.socket_path)
        if conn is not None and conn.sock is not None and not _closed_by_peer(conn.sock):
            conn.timeout = self.timeout
            conn.sock.settimeout(self.timeout)
            return conn, True
        if conn is not None:
            conn.close()
        conn = UnixHTTPConnection(self.socket_path, self.timeout)
        try:
            conn.connect()
        except OSError as exc:
            conns.pop(self.socket_path, None)
            raise RestUnavailable(f"slurmrestd at {self.socket_path}: {exc}") from exc
        conns[self.socket_path] = conn
        return conn, False

    def _send(self, method: str, path: str, body: bytes | None) -> UnixHTTPConnection:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        headers.update(self.headers)
        conn, reused = self._connection()
        try:
            conn.request(method, path, body=body, headers=headers)
        except OSError as exc:
            # The request did not get out whole, so slurmrestd acted on nothing.
            conn.close()
            if not reused:
                raise RestUnavailable(f"slurmrestd at {self.socket_path}: {exc}") from exc
            conn, _ = self._connection()  # it closed a kept-alive connection: once more
            try:
                conn.request(method, path, body=body, headers=headers)
            except OSError as exc2:
                conn.close()
                raise RestUnavailable(f"slurmrestd at {self.socket_path}: {exc2}") from exc2
        return conn

    def request(self, method: str, path: str, payload: Any = None) -> tuple[int, dict]:
        """One request; raises RestUnavailable when nothing was sent, a transient
        SlurmError when the answer never came (the request may have been acted on)."""
        body = json.dumps(payload).encode() if payload is not None else None
        conn = self._send(method, path, body)
        try:
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise SlurmError(
                f"slurmrestd did not answer: {exc}", permanent=False, command=[method, path]
            ) from exc
        if response.will_close:
            conn.close()  # slurmrestd closes after an error answer
        try:
            document = json.loads(data) if data else {}
        except ValueError:
            document = {}
        return response.status, document if isinstance(document, dict) else {}

    def ping(self) -> bool:
        try:
            status, document = self.request("GET", f"{API}/ping")
        except (RestUnavailable, SlurmError):
            return False
        return status == 200 and any(p.get("ping") == "UP" for p in document.get("pings", []))

    def submit(self, script: str, job: dict[str, Any]) -> str:
        """POST the job; returns its id. Raises RestUnavailable or RestUnsuitable when
        nothing was submitted and sbatch should take it, a transient SlurmError when
        the controller is not answering or the answer got lost."""
        command = ["POST", SUBMIT_PATH]
        status, document = self.request("POST", SUBMIT_PATH, {"script": script, "job": job})
        job_id = document.get("job_id")
        errors = [e for e in document.get("errors", []) if isinstance(e, dict)]
        if status == 200 and isinstance(job_id, int) and job_id > 0:
            # Notes such as "Job is in held state" come with an accepted job, as with sbatch.
            return str(job_id)
        reason = next(
            (str(e["error"]) for e in reversed(errors) if e.get("error")), f"HTTP {status}"
        )
        message = f"Batch job submission failed: {reason}"  # sbatch's words
        if status == 500 and any(m in message.lower() for m in TRANSIENT_MARKERS):
            # The controller is down or slow: sbatch would only wait for it too.
            raise SlurmError(message, permanent=False, command=command)
        # Nothing was submitted. 4xx: slurmrestd did not take the request as sbatch
        # would (mapping, parsing, auth). 500: Slurm refused the job, and sbatch
        # adds the controller's reason ("invalid partition specified: x") that
        # slurmrestd only logs, or waits and retries (queue full, EAGAIN): let
        # sbatch answer, so users read what they always did.
        detail = "; ".join(str(e.get("description") or e.get("error")) for e in errors)
        if status != 500:  # a mapping or setup problem worth fixing, not a user error
            log.warning("slurmrestd did not take a submit (%s): %s", status, detail)
        raise RestUnsuitable(f"slurmrestd answered {status}: {detail or message}")
