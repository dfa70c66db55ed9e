"""The poller's other half: jobs that left Slurm's queue get their final record from
accounting (sacct, one call a round for all of them), and then settle: the poller
reads them no more. UNKNOWN only when there is nothing to ask, or slurmdbd is out of
reach (then they are asked again next round)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

from django.conf import settings

from slurm.accounting import AccountingUnavailable, AcctJob

from .choices import ACTIVE_STATES, JobState
from .models import Job

UNREACHABLE = "Accounting unreachable"
NO_ACCOUNTING = "Left the queue unseen; the cluster has no accounting"
NO_RECORD = "Left the queue; accounting has no record of it"
CAUSE = "final record from accounting (sacct)"
# Most telling first: the state an array shows while its tasks differ.
ARRAY_STATE_ORDER = [
    JobState.RUNNING,
    JobState.COMPLETING,
    JobState.CONFIGURING,
    JobState.PENDING,
    JobState.REQUEUED,
    JobState.SUSPENDED,
]

Settled = tuple[Job, list[str], dict | None]  # the row, its changed fields, an event


def array_state(states: list[str]) -> str:
    for state in ARRAY_STATE_ORDER:
        if state in states:
            return state
    failed = [s for s in states if s != JobState.COMPLETED]
    return failed[0] if failed else JobState.COMPLETED


def _array_record(job_id: str, tasks: list[AcctJob]) -> AcctJob:
    """An array's own row: its tasks' records folded into one."""
    failed = [t.exit_code for t in tasks if t.exit_code not in ("", "0:0")]

    def pick(values, fold):
        values = [v for v in values if v is not None]
        return fold(values) if values else None

    return AcctJob(
        job_id=job_id,
        state=array_state([t.state for t in tasks]),
        exit_code=failed[0] if failed else tasks[0].exit_code,
        submit_time=pick((t.submit_time for t in tasks), min),
        start_time=pick((t.start_time for t in tasks), min),
        end_time=pick((t.end_time for t in tasks), max),
        elapsed_s=pick((t.elapsed_s for t in tasks), max),
        cpu_time_s=pick((t.cpu_time_s for t in tasks), sum),
        max_rss_bytes=pick((t.max_rss_bytes for t in tasks), max),
        gpus=max(t.gpus for t in tasks),
        cpus=pick((t.cpus for t in tasks), max),
        mem_bytes=pick((t.mem_bytes for t in tasks), max),
        account=tasks[0].account,
    )


def _set(job: Job, values: dict, now: datetime, cause: str) -> Settled:
    """Apply ``values`` to the row; an event when its state or reason changes."""
    changed = [name for name, value in values.items() if getattr(job, name) != value]
    event = None
    if "state" in changed or "reason" in changed:
        event = {
            "job_id": job.pk,
            "time": now,
            "state": values.get("state", job.state),
            "reason": values.get("reason", job.reason),
            "cause": cause,
        }
    for name in changed:
        setattr(job, name, values[name])
    if changed:
        job.update_time = now
    return job, changed, event


# What a final record sets beyond the queue's own fields (the Job field, the record's
# attribute): the poller loads them with the rows it may settle (read one at a time,
# each was a query per job).
RECORD_FIELDS = {
    "elapsed_s": "elapsed_s",
    "cpu_time_s": "cpu_time_s",
    "max_rss_bytes": "max_rss_bytes",
    "gpus_allocated": "gpus",
    "cpus_allocated": "cpus",
    "mem_allocated_bytes": "mem_bytes",
    "account": "account",
}


def _from_record(job: Job, record: AcctJob) -> dict:
    return {
        "state": record.state,
        # Slurm's reason for a final state (NonZeroExitCode, ...) as squeue last gave it.
        "reason": job.reason if record.state == job.state else "",
        "exit_code": record.exit_code,
        "start_time": record.start_time or job.start_time,
        "end_time": record.end_time or job.end_time,
        "expected_start_time": None,
        **{field: getattr(record, name) for field, name in RECORD_FIELDS.items()},
        "settled": True,
        "gone_time": None,
    }


def asked_once(
    accounting: Callable[[list[str]], dict[str, AcctJob]], job_ids: list[str]
) -> Callable[[list[str]], dict[str, AcctJob]]:
    """``accounting`` for ``job_ids``, asked once (one sacct a round) and answered to
    each caller: the records, or the same AccountingUnavailable."""
    answer: dict[str, AcctJob] | AccountingUnavailable
    try:
        answer = accounting(job_ids)
    except AccountingUnavailable as exc:
        answer = exc

    def records(_ids: list[str]) -> dict[str, AcctJob]:
        if isinstance(answer, AccountingUnavailable):
            raise answer
        return answer

    return records


def settle_ended(
    ended: list[Job], accounting: Callable[[list[str]], dict[str, AcctJob]], *, now: datetime
) -> Iterator[Settled]:
    """Rows the queue shows ended settle once accounting has their final record, so the
    rounds skip them for the rest of their MinJobAge in slurmctld; a record still active
    (slurmdbd behind) or none yet: asked again next round. No accounting at all: they
    settle as squeue ended them."""
    if not ended:
        return
    try:
        records = accounting([job.job_id for job in ended])
    except AccountingUnavailable as exc:
        if not exc.configured:
            for job in ended:
                yield _set(job, {"settled": True}, now, "")
        return
    for job in ended:
        record = records.get(job.job_id)
        if record is not None and record.state not in ACTIVE_STATES:
            yield _set(job, _from_record(job, record), now, CAUSE)


def settle(
    leavers: list[Job], accounting: Callable[[list[str]], dict[str, AcctJob]], *, now: datetime
) -> Iterator[Settled]:
    """Final records for the unsettled rows that are no longer in the queue."""
    try:
        records = accounting([job.job_id for job in leavers])
    except AccountingUnavailable as exc:
        for job in leavers:
            if not exc.configured:  # nothing to ask, now or later: settle as it stands
                values = {"settled": True}
                if job.state in ACTIVE_STATES:
                    values.update(state=JobState.UNKNOWN, reason=NO_ACCOUNTING)
            elif job.state in ACTIVE_STATES or job.state == JobState.UNKNOWN:
                values = {"state": JobState.UNKNOWN, "reason": f"{UNREACHABLE}: {exc}"[:200]}
            else:
                continue  # its squeue end stands until accounting answers
            yield _set(job, values, now, "no longer in Slurm's queue")
        return
    tasks: dict[str, list[AcctJob]] = {}
    for record in records.values():
        number, _, task = record.job_id.partition("_")
        if task:
            tasks.setdefault(number, []).append(record)
    grace = timedelta(seconds=settings.MTC_ACCOUNTING_GRACE_S)
    for job in leavers:
        record = records.get(job.job_id)
        if record is None and job.array_task_id is None and job.job_id in tasks:
            record = _array_record(job.job_id, tasks[job.job_id])
        if record is not None:
            yield _set(job, _from_record(job, record), now, CAUSE)
        elif job.gone_time is None:
            # slurmctld may still hold the record (slurmdbd was away): wait a while.
            yield _set(job, {"gone_time": now}, now, "")
        elif now - job.gone_time > grace:
            values = {"settled": True}
            if job.state in ACTIVE_STATES or job.state == JobState.UNKNOWN:
                values.update(state=JobState.UNKNOWN, reason=NO_RECORD)
            yield _set(job, values, now, "no longer in Slurm's queue")
