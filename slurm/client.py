"""Every Slurm call as an argument list (never a shell), with the cluster's
SLURM_CONF, a timeout, and errors split into transient and permanent. Submits go
to the cluster's slurmrestd when it has one (rest.py), else to sbatch.

Past 400 lines on purpose: it is the one adapter to Slurm, every call in one place
(tests swap it at this edge)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .errors import TRANSIENT_MARKERS, SlurmError

log = logging.getLogger(__name__)

NODE_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,79}$")
SIGNAL_NAME_RE = re.compile(r"(SIG)?[A-Z][A-Z0-9]{1,9}|[0-9]{1,2}")


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # Slurm's base state, upper case: IDLE, ALLOCATED, MIXED, DOWN, ...
    flags: tuple[str, ...]  # DRAIN, NOT_RESPONDING, ...
    reason: str
    cpus: int
    gres: str

    @property
    def display_state(self) -> str:
        """One word like sinfo's %T: idle, drained, draining, down*, ..."""
        state = self.state.lower()
        if "DRAIN" in self.flags:
            state = "drained" if self.state in ("IDLE", "DOWN") else "draining"
        if "NOT_RESPONDING" in self.flags:
            state += "*"
        return state


class RunAs(Protocol):
    """Whose job it is: a POSIX account (identity.models.PosixAccount fits)."""

    name: str
    uid: int
    gid: int


def _check_job_ids(job_ids: list[str]) -> None:
    """Whole job ids only (12, 12_3): anything else is refused before a command runs."""
    from .queue import JOB_ID_RE

    for job_id in job_ids:
        if not JOB_ID_RE.fullmatch(job_id):
            raise SlurmError(f"invalid job id {job_id!r}", permanent=True)


class SlurmClient:
    def __init__(
        self,
        conf_path: Path | str,
        *,
        timeout: float = 15.0,
        rest_socket: str | None = None,
        rest_auth: Callable[[str | None], dict[str, str]] | None = None,
    ):
        self.conf_path = str(conf_path)
        self.timeout = timeout
        # The cluster's slurmrestd socket, if it runs one: submits go there first.
        self.rest_socket = rest_socket
        # user name (None: mtc's own) -> the headers slurmrestd authenticates.
        self.rest_auth = rest_auth

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SLURM_CONF"] = self.conf_path
        return env

    def run(
        self,
        args: list[str],
        *,
        stdin: str | None = None,
        timeout: float | None = None,
        check: bool = True,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        as_user: RunAs | None = None,
    ) -> subprocess.CompletedProcess:
        """``args`` (an argument list, never a shell); ``as_user``: run as that account
        (its uid, its group only), so Slurm authenticates the call as theirs."""
        switch = {}
        if as_user is not None:
            switch = dict(user=as_user.uid, group=as_user.gid, extra_groups=[as_user.gid])
        try:
            proc = subprocess.run(
                args,
                input=stdin,
                capture_output=True,
                text=True,
                env=env or self.env(),
                cwd=cwd,
                timeout=timeout or self.timeout,
                check=False,
                **switch,
            )
        except subprocess.TimeoutExpired as exc:
            raise SlurmError(f"{args[0]} timed out", permanent=False, command=args) from exc
        except FileNotFoundError as exc:
            raise SlurmError(f"{args[0]} is not installed", permanent=True, command=args) from exc
        if check and proc.returncode != 0:
            message = (proc.stderr or proc.stdout).strip() or f"{args[0]} exited {proc.returncode}"
            message = message.removeprefix(f"{args[0]}: error: ")
            transient = any(m in message.lower() for m in TRANSIENT_MARKERS)
            raise SlurmError(message, permanent=not transient, command=args)
        return proc

    # --- reads -----------------------------------------------------------
    def ping(self) -> bool:
        try:
            out = self.run(["scontrol", "ping"], timeout=5, check=False).stdout
        except SlurmError:
            return False
        return "is UP" in out

    def nodes(self) -> list[SlurmNode]:
        """All nodes, from one `sinfo` call (formatted output: fast and stable)."""
        out = self.run(
            ["sinfo", "--noheader", "--Node", "--format=%N|%T|%c|%G|%E", "--noconvert"]
        ).stdout
        nodes: dict[str, SlurmNode] = {}
        for line in out.splitlines():
            parts = line.split("|", 4)
            if len(parts) != 5:
                continue
            name, state, cpus, gres, reason = parts
            nodes[name] = parse_sinfo_state(name, state, cpus, gres, reason)
        return list(nodes.values())

    def node_jobs(self, name: str) -> list[str]:
        """Ids of the jobs Slurm has on one node now (a failed squeue raises: read as
        "none", a repair would reboot the node under its jobs)."""
        if not NODE_NAME_RE.fullmatch(name):
            raise SlurmError(f"invalid node name {name!r}", permanent=True)
        proc = self.run(["squeue", "--noheader", f"--nodelist={name}", "--format=%i"])
        return proc.stdout.split()

    # --- writes ----------------------------------------------------------
    def node_update(self, names: list[str], *, state: str, reason: str = "") -> None:
        for name in names:
            if not NODE_NAME_RE.fullmatch(name):
                raise SlurmError(f"invalid node name {name!r}", permanent=True)
        args = ["scontrol", "update", f"NodeName={','.join(names)}", f"State={state}"]
        if reason:
            args.append(f"Reason={reason}")
        try:
            self.run(args)
        except SlurmError as exc:
            # Slurm refuses RESUME for a node that is neither down nor drained. With
            # ReturnToService=2 a DOWN node comes back on its own when slurmd
            # registers, so "already back" is the outcome RESUME asked for.
            if state.upper() != "RESUME" or "invalid node state" not in str(exc).lower():
                raise
            wanted = set(names)
            if any(
                n.state == "DOWN" or "DRAIN" in n.flags for n in self.nodes() if n.name in wanted
            ):
                raise

    def node_delete(self, names: list[str]) -> None:
        """Forget dynamic nodes (cloud clusters) once their machines are gone."""
        for name in names:
            if not NODE_NAME_RE.fullmatch(name):
                raise SlurmError(f"invalid node name {name!r}", permanent=True)
        if names:
            self.run(["scontrol", "delete", f"NodeName={','.join(names)}"])

    def reconfigure(self) -> None:
        self.run(["scontrol", "reconfigure"])

    def queue(self) -> list:
        """Every job slurmctld still holds (also ones that ended within MinJobAge),
        array tasks one per line, from one `squeue` call."""
        from .queue import SQUEUE_FORMAT, parse_squeue

        out = self.run(
            [
                "squeue",
                "--noheader",
                "--states=all",
                "--array",
                f"--Format={SQUEUE_FORMAT}",
            ],
            timeout=60,
        ).stdout
        return parse_squeue(out)

    def queue_json(self) -> list:
        from .queue import parse_squeue_json

        out = self.run(["squeue", "--states=all", "--array", "--json"], timeout=120).stdout
        return parse_squeue_json(json.loads(out))

    def accounting(self, job_ids: list[str]) -> dict:
        """Final records of ``job_ids`` from slurmdbd ({job id: AcctJob}; a job it has
        no record of is absent), with one `sacct` call per BATCH ids. Raises
        AccountingUnavailable when the cluster has no accounting or slurmdbd is out of
        reach. Without --duplicates sacct gives a reused id's newest job only."""
        from .accounting import BATCH, SACCT_FORMAT, parse_sacct, unavailable

        _check_job_ids(job_ids)
        found: dict = {}
        for start in range(0, len(job_ids), BATCH):
            args = [
                "sacct",
                "--parsable2",
                "--noheader",
                "--noconvert",
                "--allusers",
                f"--format={SACCT_FORMAT}",
                f"--jobs={','.join(job_ids[start : start + BATCH])}",
            ]
            try:
                out = self.run(args, timeout=60).stdout
            except SlurmError as exc:
                raise unavailable(exc) from exc
            found.update(parse_sacct(out))
        return found

    def batch_ends(self, job_ids: list[str]) -> dict:
        """Whether each requeued job's earlier run has ended its batch script as far as
        slurmctld knows ({job id: BatchEnd}; one sacct call). Raises AccountingUnavailable
        as ``accounting`` does."""
        from .accounting import BATCH_FORMAT, parse_batch_ends, unavailable

        _check_job_ids(job_ids)
        args = ["sacct", "--duplicates", "--parsable2", "--noheader", "--allusers"]
        args += [f"--format={BATCH_FORMAT}", f"--jobs={','.join(job_ids)}"]
        try:
            return parse_batch_ends(self.run(args, timeout=60).stdout)
        except SlurmError as exc:
            raise unavailable(exc) from exc

    def accounting_cluster_add(self, name: str) -> None:
        """Register a cluster with slurmdbd (before its slurmctld first starts);
        one that is already registered is left as it is."""
        if not re.fullmatch(r"[A-Za-z0-9_]{1,40}", name):
            raise SlurmError(f"invalid cluster name {name!r}", permanent=True)
        proc = self.run(["sacctmgr", "--immediate", "add", "cluster", name], check=False)
        if proc.returncode != 0 and "already exists" not in proc.stdout + proc.stderr:
            from .accounting import unavailable

            message = (proc.stderr or proc.stdout).strip() or f"sacctmgr exited {proc.returncode}"
            raise unavailable(SlurmError(message, permanent=False, command=proc.args))

    def job(self, job_id: str):
        """One job from the queue, or None when slurmctld no longer knows it."""
        from .queue import JOB_ID_RE, SQUEUE_FORMAT, parse_squeue

        if not JOB_ID_RE.fullmatch(job_id):
            raise SlurmError(f"invalid job id {job_id!r}", permanent=True)
        proc = self.run(
            [
                "squeue",
                "--noheader",
                "--states=all",
                "--array",
                f"--jobs={job_id}",
                f"--Format={SQUEUE_FORMAT}",
            ],
            check=False,
        )
        jobs = [j for j in parse_squeue(proc.stdout) if j.job_id == job_id]
        return jobs[0] if jobs else None

    def submit(
        self,
        args: list[str],
        script: str,
        env: dict[str, str],
        *,
        run_as: RunAs | None = None,
    ) -> str:
        """Submit the job that ``args`` (an sbatch argument list) describes, with
        ``script`` as its batch script and ``env`` as its extra environment. Returns
        the job id. ``run_as`` (an account with ``.name .uid .gid``): the job runs
        as that user; None: as mtc itself (mtc's own jobs).

        Through the cluster's slurmrestd when it answers, else by running sbatch
        with the script on stdin; either way the same job with the same environment:
        PATH, LANG, LC_ALL and TZ of this process, ``env``, SLURM_CONF, and the
        SLURM_* variables sbatch adds (task counts, submit dir and host, umask,
        resource limits). The submit dir is the job's --chdir.

        As the owner, on every path, so slurmctld judges every option as the owner's own
        (``--priority``, ``--nice=-N``, a root-only partition, an operator's reservation
        are theirs to ask only as far as Slurm lets them): slurmrestd gets a token minted
        for the owner (``rest_auth(owner)``), and sbatch, for what REST cannot carry
        (directives, options without a mapping) or when slurmrestd is down, runs as the
        owner's account, never as root with ``--uid``.
        """
        from .rest import RestUnavailable, RestUnsuitable, option_values

        base = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")}
        base.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        job_env = {**base, **env, "SLURM_CONF": self.conf_path}
        impersonate = run_as is not None and run_as.uid != os.geteuid()
        if impersonate:
            job_env.update(USER=run_as.name, LOGNAME=run_as.name)
            if getattr(run_as, "home", ""):
                job_env["HOME"] = run_as.home
        chdir = option_values(args)[0].get("--chdir", "")
        submit_dir = chdir if chdir and os.path.isdir(chdir) else os.getcwd()
        if self.rest_socket and (self.rest_auth or not impersonate):
            try:
                return self.submit_rest(
                    args, script, job_env, submit_dir, user=run_as.name if impersonate else None
                )
            except RestUnavailable as exc:  # not running (yet): the usual case elsewhere
                log.debug("submitting with sbatch: %s", exc)
            except RestUnsuitable as exc:
                log.info("submitting with sbatch instead of slurmrestd: %s", exc)
        proc = self.run(
            args, stdin=script, env=job_env, cwd=submit_dir, as_user=run_as if impersonate else None
        )
        return proc.stdout.strip().split(";")[0]

    def submit_rest(
        self,
        args: list[str],
        script: str,
        job_env: dict[str, str],
        submit_dir: str,
        *,
        user: str | None = None,
    ) -> str:
        """The REST half of ``submit``: ``job_env`` is the environment sbatch would
        get; the job gets it plus what sbatch adds. ``user``: submit as them."""
        from .rest import RestClient, check_script, job_description, sbatch_environment

        check_script(script)
        environment = {**job_env, **sbatch_environment(args, submit_dir)}
        job = job_description(args, environment)
        headers = self.rest_auth(user) if self.rest_auth else {}
        return RestClient(self.rest_socket, timeout=self.timeout, headers=headers).submit(
            script, job
        )

    def control(self, action: str, job_id: str) -> None:
        """cancel, requeue, hold or release one job."""
        from .queue import JOB_ID_RE

        if not JOB_ID_RE.fullmatch(job_id):
            raise SlurmError(f"invalid job id {job_id!r}", permanent=True)
        commands = {
            "cancel": ["scancel", job_id],
            "requeue": ["scontrol", "requeue", job_id],
            "hold": ["scontrol", "uhold", job_id],  # a user hold, as the user asked
            "release": ["scontrol", "release", job_id],
        }
        self.run(commands[action])
        if action == "requeue":
            # Slurm holds a requeued job back (BeginTime, ~2 minutes); let it start now.
            self.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=False)

    def job_start_now(self, job_id: str) -> None:
        """Drop a requeued job's BeginTime hold-back (best effort)."""
        self.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=False)

    def job_signal(self, job_id: str, signal: str, *, full: bool = False) -> None:
        """Send ``signal`` (a name, USR1, or a number, 23) to a job's steps' processes, or
        with ``full`` to the whole job (scancel --full; on 22.05 that reached the batch
        shell but not the tasks of the job's srun step)."""
        from .queue import JOB_ID_RE

        if not JOB_ID_RE.fullmatch(job_id):
            raise SlurmError(f"invalid job id {job_id!r}", permanent=True)
        if not SIGNAL_NAME_RE.fullmatch(signal):
            raise SlurmError(f"invalid signal {signal!r}", permanent=True)
        self.run(["scancel", f"--signal={signal}", *(["--full"] if full else []), job_id])

    def job_exclude(self, job_id: str, nodes: list[str]) -> None:
        """Keep a pending job off these nodes (its ExcNodeList; Slurm takes it only while
        the job is pending, a requeued one included)."""
        from .queue import JOB_ID_RE

        if not JOB_ID_RE.fullmatch(job_id):
            raise SlurmError(f"invalid job id {job_id!r}", permanent=True)
        for name in nodes:
            if not NODE_NAME_RE.fullmatch(name):
                raise SlurmError(f"invalid node name {name!r}", permanent=True)
        self.run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(nodes)}"])

    def cancel_all(self) -> None:
        out = self.run(["squeue", "--noheader", "--format=%A"], check=False).stdout
        ids = [j for j in out.split() if j.isdigit()]
        if ids:
            self.run(["scancel", *ids], check=False)


# sinfo %T prints e.g. "idle", "drained", "draining", "down*", "idle~", "mixed-".
_SUFFIX_FLAGS = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "%": "POWERING_DOWN",
    "!": "POWER_DOWN",
    "$": "MAINTENANCE",
    "@": "REBOOT",
    "^": "REBOOT_ISSUED",
    "-": "PLANNED",
}


def parse_sinfo_state(name: str, state: str, cpus: str, gres: str, reason: str) -> SlurmNode:
    flags: list[str] = []
    state = state.strip()
    while state and state[-1] in _SUFFIX_FLAGS:
        flags.append(_SUFFIX_FLAGS[state[-1]])
        state = state[:-1]
    base = state.upper()
    if base in ("DRAINED", "DRAINING"):
        flags.append("DRAIN")
        base = "IDLE" if base == "DRAINED" else "ALLOCATED"
    elif base.startswith("DOWN") or base == "NOT_RESPONDING":
        base = "DOWN"
    try:
        cpu_count = int(cpus)
    except ValueError:
        cpu_count = 0
    return SlurmNode(
        name=name,
        state=base,
        flags=tuple(flags),
        reason="" if reason.strip() == "none" else reason.strip(),
        cpus=cpu_count,
        gres="" if gres == "(null)" else gres,
    )
