"""Reading Slurm's accounting: `sacct --parsable2` for the jobs that left the queue
(final state, exit code, times, usage), and what its failures mean."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from .errors import SlurmError
from .queue import parse_time

# (sacct field, attribute) in output order. JobID prints 12 / 12_3 for allocations and
# 12.batch / 12_3.0 for their steps; the usage (TotalCPU, MaxRSS) is the steps'.
FIELDS = (
    ("JobID", "job_id"),
    ("State", "state"),
    ("ExitCode", "exit_code"),
    ("Submit", "submit_time"),
    ("Start", "start_time"),
    ("End", "end_time"),
    ("ElapsedRaw", "elapsed_s"),
    ("TotalCPU", "cpu_time"),
    ("MaxRSS", "max_rss"),
    ("AllocTRES", "alloc_tres"),
    ("Account", "account"),
)
SACCT_FORMAT = ",".join(field for field, _ in FIELDS)
# Ids per sacct call: one call covers a round's leavers (a command line stays short).
BATCH = 2000
_ALLOC_RE = re.compile(r"^[0-9]+(_[0-9]+)?$")
_STEP_RE = re.compile(r"^([0-9]+(?:_[0-9]+)?)\.[A-Za-z0-9_+-]+$")
_GPU_TRES_RE = re.compile(r"(?:^|,)gres/gpu=([0-9]+)")
_CPU_TRES_RE = re.compile(r"(?:^|,)cpu=([0-9]+)")
_MEM_TRES_RE = re.compile(r"(?:^|,)mem=([0-9.]+[KMGT]?)")
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class AccountingUnavailable(SlurmError):
    """sacct could not answer. ``configured`` False: the cluster has no accounting
    storage at all (asking again will not help); True: slurmdbd is unreachable."""

    def __init__(self, message: str, *, configured: bool, command: list[str] | None = None):
        super().__init__(message, permanent=not configured, command=command)
        self.configured = configured


@dataclass(frozen=True)
class AcctJob:
    job_id: str
    state: str
    exit_code: str
    submit_time: datetime | None
    start_time: datetime | None
    end_time: datetime | None
    elapsed_s: int | None
    cpu_time_s: float | None  # CPU time the job's processes used (TotalCPU)
    max_rss_bytes: int | None  # the largest resident set of any of its steps
    gpus: int  # GPUs allocated (gres/gpu in AllocTRES)
    # AllocTRES's cpu= and mem= (the whole allocation), and the job's Slurm account.
    cpus: int | None = None
    mem_bytes: int | None = None
    account: str = ""


def parse_duration(text: str) -> float | None:
    """sacct's [DD-[HH:]]MM:SS[.mmm] -> seconds."""
    text = text.strip()
    if not text:
        return None
    days, _, rest = text.rpartition("-")
    parts = rest.split(":")
    try:
        seconds = float(parts[-1])
        minutes = int(parts[-2]) if len(parts) > 1 else 0
        hours = int(parts[-3]) if len(parts) > 2 else 0
        return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
    except ValueError:
        return None


def parse_size(text: str) -> int | None:
    """MaxRSS: bytes with --noconvert, else 123K / 4.5G."""
    text = text.strip()
    if not text:
        return None
    scale = _UNITS.get(text[-1].upper(), 1)
    try:
        return int(float(text.rstrip("KMGTkmgt")) * scale)
    except ValueError:
        return None


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def parse_sacct(text: str) -> dict[str, AcctJob]:
    """`sacct --parsable2 --noheader` lines -> {job id: its record}: the allocation's
    line, with the usage of its steps folded in."""
    allocations: dict[str, dict[str, str]] = {}
    cpu: dict[str, float] = {}
    rss: dict[str, int] = {}
    width = len(FIELDS)
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != width:
            continue
        row = dict(zip((attr for _, attr in FIELDS), parts, strict=True))
        job_id = row["job_id"].strip()
        step = _STEP_RE.fullmatch(job_id)
        if step:
            owner = step.group(1)
            size = parse_size(row["max_rss"])
            if size is not None:
                rss[owner] = max(rss.get(owner, 0), size)
            continue
        if _ALLOC_RE.fullmatch(job_id):
            allocations[job_id] = row
            seconds = parse_duration(row["cpu_time"])
            if seconds is not None:
                cpu[job_id] = seconds  # the allocation's TotalCPU sums its steps
    jobs = {}
    for job_id, row in allocations.items():
        gpus = _GPU_TRES_RE.search(row["alloc_tres"])
        cpus = _CPU_TRES_RE.search(row["alloc_tres"])
        mem = _MEM_TRES_RE.search(row["alloc_tres"])
        jobs[job_id] = AcctJob(
            job_id=job_id,
            # "CANCELLED by 0" -> CANCELLED
            state=row["state"].split()[0].rstrip("+") if row["state"].strip() else "UNKNOWN",
            exit_code=row["exit_code"].strip(),
            submit_time=parse_time(row["submit_time"]),
            start_time=parse_time(row["start_time"]),
            end_time=parse_time(row["end_time"]),
            elapsed_s=_int(row["elapsed_s"]),
            cpu_time_s=cpu.get(job_id),
            max_rss_bytes=rss.get(job_id) or parse_size(row["max_rss"]),
            gpus=int(gpus.group(1)) if gpus else 0,
            cpus=int(cpus.group(1)) if cpus else None,
            mem_bytes=(parse_size(mem.group(1)) or None) if mem else None,  # mem=0: none
            account=row["account"].strip(),
        )
    return jobs


# `sacct --duplicates` columns for a requeued job's earlier runs' batch steps.
BATCH_FORMAT = "JobID,State,NodeList"
# A batch step's states once its script's end reached slurmctld (not REQUEUED, RUNNING).
BATCH_ENDED = {
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
}


@dataclass(frozen=True)
class BatchEnd:
    """A job's latest batch step as accounting has it. A requeue records the running
    batch step as REQUEUED at once; its own end (state, exit code) replaces that when the
    script's completion reaches slurmctld, which may be seconds later."""

    state: str  # REQUEUED until then
    host: str  # the node the batch script ran on

    @property
    def ended(self) -> bool:
        return self.state in BATCH_ENDED


def parse_batch_ends(text: str) -> dict[str, BatchEnd]:
    """`sacct --duplicates --parsable2 --noheader --format=JobID,State,NodeList` ->
    {job id: the batch step of its latest run that started one} (runs are listed oldest
    first, an earlier job with the same id included: a run whose script never started
    has no script to end, and an earlier one's has ended)."""
    ends: dict[str, BatchEnd] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[0].endswith(".batch"):
            continue
        job_id = parts[0].removesuffix(".batch")
        state = parts[1].split()[0] if parts[1].strip() else ""
        if _ALLOC_RE.fullmatch(job_id):
            ends[job_id] = BatchEnd(state=state, host=parts[2])
    return ends


def unavailable(exc: SlurmError) -> AccountingUnavailable:
    """What a failed sacct means: no accounting at all, or slurmdbd out of reach."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    why = (lines[-1] if lines else "sacct failed").removeprefix("sacct: error: ")
    configured = "accounting storage is disabled" not in why.lower()
    return AccountingUnavailable(why, configured=configured, command=exc.command)
