"""Reading Slurm's queue: `squeue -O` with a field separator Slurm never prints
(the fast path), and `squeue --json` (the fallback; many times slower on big queues,
see bench/jobs_scale.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

SEP = "\x1f"  # ASCII unit separator
# (squeue -O field, attribute) in output order.
FIELDS = (
    ("JobArrayID", "job_id"),
    ("ArrayJobID", "array_job_id"),
    ("ArrayTaskID", "array_task_id"),
    ("Name", "name"),
    ("UserName", "user"),
    ("Partition", "partition"),
    ("State", "state"),
    ("Reason", "reason"),
    ("NumNodes", "nodes"),
    ("NodeList", "node_list"),
    ("NumCPUs", "cpus"),
    ("tres-per-node", "tres_per_node"),
    ("TimeLimit", "time_limit"),
    ("SubmitTime", "submit_time"),
    ("StartTime", "start_time"),
    ("EndTime", "end_time"),
    ("exit_code", "exit_code"),
    ("RestartCnt", "restart_count"),
)
SQUEUE_FORMAT = ",".join(f"{field}:0{SEP}" for field, _ in FIELDS)
JOB_ID_RE = re.compile(r"^[0-9]+(_[0-9]+)?$")
_GPU_RE = re.compile(r"gpu(?::[A-Za-z0-9_-]+)?:([0-9]+)")


@dataclass(frozen=True)
class QueueJob:
    job_id: str
    job_number: int
    array_task_id: int | None
    name: str
    user: str
    partition: str
    state: str
    reason: str
    nodes: int
    node_list: str
    cpus: int
    gpus_per_node: int
    time_limit: str
    submit_time: datetime | None
    start_time: datetime | None
    end_time: datetime | None
    exit_code: str
    restart_count: int
    # When Slurm (the backfill scheduler) expects a pending job to start; None when it
    # does not know. Only pending jobs have one.
    expected_start_time: datetime | None = None


# Slurm puts a pending job it cannot plan for (held, over a limit, no node could ever
# fit it) a year ahead: no expectation, not a date to show.
EXPECTED_START_HORIZON = timedelta(days=300)


def expected_start(state: str, start_time: datetime | None, now: datetime) -> datetime | None:
    """A pending job's StartTime as an expectation, None when there is none."""
    if state != "PENDING" or start_time is None:
        return None
    return start_time if start_time - now <= EXPECTED_START_HORIZON else None


def parse_time(value: str) -> datetime | None:
    """Slurm prints local time without a zone; 'N/A', 'Unknown' and 'None' mean none."""
    if not value or value in ("N/A", "Unknown", "None", "0"):
        return None
    try:
        return datetime.fromisoformat(value).astimezone(UTC)
    except ValueError:
        return None


def _int(value: str, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def exit_code_from_status(raw: str) -> str:
    """squeue prints the wait status (exit << 8 | signal); Slurm shows it as exit:signal."""
    status = _int(raw, -1)
    if status < 0:
        return ""
    return f"{status >> 8}:{status & 0x7F}"


def gpus_from_tres(tres: str) -> int:
    match = _GPU_RE.search(tres or "")
    return int(match.group(1)) if match else 0


def parse_squeue(text: str, *, now: datetime | None = None) -> list[QueueJob]:
    now = now or datetime.now(UTC)
    jobs: list[QueueJob] = []
    width = len(FIELDS)
    for line in text.splitlines():
        parts = line.split(SEP)
        if len(parts) < width:
            continue
        row = dict(zip((attr for _, attr in FIELDS), parts, strict=False))
        job_id = row["job_id"].strip()
        if not JOB_ID_RE.fullmatch(job_id):
            continue  # a pending array's summary line such as 12_[0-99]
        number, _, task = job_id.partition("_")
        state = row["state"].split()[0].rstrip("+") if row["state"] else "UNKNOWN"
        start_time = parse_time(row["start_time"])
        jobs.append(
            QueueJob(
                job_id=job_id,
                job_number=int(number),
                array_task_id=int(task) if task else None,
                name=row["name"],
                user=row["user"],
                partition=row["partition"],
                state=state,
                reason="" if row["reason"] in ("None", "(null)") else row["reason"],
                nodes=_int(row["nodes"], 1),
                node_list="" if row["node_list"] in ("(null)", "N/A") else row["node_list"],
                cpus=_int(row["cpus"], 1),
                gpus_per_node=gpus_from_tres(row["tres_per_node"]),
                time_limit=row["time_limit"],
                submit_time=parse_time(row["submit_time"]),
                start_time=start_time,
                end_time=parse_time(row["end_time"]),
                exit_code=exit_code_from_status(row["exit_code"]),
                restart_count=_int(row["restart_count"]),
                expected_start_time=expected_start(state, start_time, now),
            )
        )
    return jobs


def _json_time(value) -> datetime | None:
    if isinstance(value, dict):  # newer Slurm: {"set": true, "number": ...}
        value = value.get("number") if value.get("set", True) else 0
    if not value:
        return None
    return datetime.fromtimestamp(int(value), tz=UTC)


def expand_task_string(text: str) -> list[int]:
    """Slurm's pending-task form: '0-3', '1,3,5-9:2', '0-999%10' -> task ids."""
    tasks: list[int] = []
    for part in text.split("%")[0].split(","):
        if not part:
            continue
        bounds, _, step = part.partition(":")
        low, _, high = bounds.partition("-")
        tasks.extend(range(int(low), int(high or low) + 1, int(step or 1)))
    return tasks


def _number(value) -> int | None:
    if isinstance(value, dict):  # newer Slurm: {"set": true, "number": 5}
        return value.get("number") if value.get("set", True) else None
    return value


def parse_squeue_json(data: dict, *, now: datetime | None = None) -> list[QueueJob]:
    """`squeue --json` (Slurm 22.05's openapi v0.0.38 shape; later shapes where they
    differ in the fields used here). A pending array is one record there: expanded."""
    now = now or datetime.now(UTC)
    jobs = []
    for job in data.get("jobs", []):
        array_number = _number(job.get("array_job_id")) or 0
        task = _number(job.get("array_task_id"))
        number = array_number or _number(job.get("job_id"))
        if array_number and task is None:
            tasks = expand_task_string(job.get("array_task_string") or "")
        else:
            tasks = [task if array_number else None]
        state = job.get("job_state", "UNKNOWN")
        if isinstance(state, list):
            state = state[0] if state else "UNKNOWN"
        exit_code = job.get("exit_code")
        if isinstance(exit_code, dict):
            rc = _number(exit_code.get("return_code", 0)) or 0
            exit_text = f"{rc}:0"
        else:
            exit_text = exit_code_from_status(str(exit_code)) if exit_code is not None else ""
        reason = job.get("state_reason")
        limit = _number(job.get("time_limit"))
        start_time = _json_time(job.get("start_time"))
        fields = dict(
            name=job.get("name", ""),
            user=job.get("user_name", ""),
            partition=job.get("partition", ""),
            state=state,
            reason="" if reason in (None, "None") else reason,
            nodes=_int(_number(job.get("node_count", 1)), 1),
            node_list=job.get("nodes", "") or "",
            cpus=_int(_number(job.get("cpus", 1)), 1),
            gpus_per_node=gpus_from_tres(job.get("tres_per_node", "") or ""),
            time_limit="UNLIMITED" if limit is None else str(limit),
            submit_time=_json_time(job.get("submit_time")),
            start_time=start_time,
            end_time=_json_time(job.get("end_time")),
            exit_code=exit_text,
            restart_count=_int(job.get("restart_cnt", 0)),
            expected_start_time=expected_start(state, start_time, now),
        )
        for task_id in tasks:
            job_id = f"{number}_{task_id}" if task_id is not None else str(number)
            jobs.append(
                QueueJob(job_id=job_id, job_number=int(number), array_task_id=task_id, **fields)
            )
    return jobs
