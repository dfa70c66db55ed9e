"""Why a job is pending, in plain words and with what would let it start, from what the
poller stored (Slurm's reason, squeue's expected start) and the other rows: never a
Slurm call per request."""

from __future__ import annotations

import re

from django.db.models import F, Sum
from django.utils import timezone

from clusters.models import SlurmAccount

from .choices import ACTIVE_STATES, JobState
from .models import Job

GPU_LIMIT_RE = re.compile(r"gres/gpu(?::[a-z0-9]+)?=(\d+)")

SIMPLE = {
    "JobHeldAdmin": "held by an operator (admin); an operator must release it",
    "JobHeldUser": "held by its owner; release it to let it start",
    "Dependency": "waiting for the jobs it depends on to finish",
    "DependencyNeverSatisfied": "its dependency can never be met (a job it needs failed);"
    " cancel it",
    "BeginTime": "waiting for its begin time",
    "PartitionDown": "its partition is down; an operator must bring it up",
    "PartitionInactive": "its partition is inactive",
    "ReqNodeNotAvail": "the nodes it needs are unavailable (down, drained or reserved)",
    "NodeDown": "a node it needs is down",
    "BadConstraints": "it asks for more than any node has; change its request",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows",
    "PartitionTimeLimit": "its time limit is over the partition's",
    "InvalidAccount": "its account is not valid on this cluster",
    "InvalidQOS": "its QoS is not valid for its account",
    "QOSMaxGRESPerUser": "its owner reached the QoS's per-user GPU limit",
    "AssocMaxJobsLimit": "its account reached its limit on running jobs",
    "AssocGrpGRESMinutes": "",  # filled in below (a GPU-minutes budget)
}


def _gpus_in_use(job: Job, account: str) -> int:
    rows = Job.objects.filter(
        cluster_id=job.cluster_id,
        state=JobState.RUNNING,
        options__account=account,
    )
    return rows.aggregate(n=Sum(F("nodes") * F("gpus_per_node")))["n"] or 0


def _gpu_limit(account: str, field: str) -> int | None:
    record = SlurmAccount.objects.filter(name=account).first()
    match = record and GPU_LIMIT_RE.search(getattr(record, field))
    return int(match.group(1)) if match else None


def _resources(job: Job) -> str:
    nodes = f"{job.nodes} free node" + ("s" if job.nodes != 1 else "")
    gpus = f" with {job.gpus_per_node} GPUs" if job.gpus_per_node else ""
    part = f" in partition {job.partition}" if job.partition else ""
    ahead = Job.objects.filter(
        cluster_id=job.cluster_id,
        state=JobState.PENDING,
        partition=job.partition,
        job_number__lt=job.job_number,
    ).count()
    text = f"waiting for {nodes}{gpus}{part}; {ahead} job{'s' if ahead != 1 else ''} ahead"
    if job.expected_start_time and job.expected_start_time > timezone.now():
        local = timezone.localtime(job.expected_start_time)
        text += f"; expected start {local:%H:%M}"
    return text


def pending_explanation(job: Job) -> str:
    """One sentence for a pending (or held) job; "" for any other."""
    if job.state not in ACTIVE_STATES or job.state != JobState.PENDING or not job.reason:
        return ""
    reason = job.reason.split(",")[0].strip("() ")
    account = (job.options or {}).get("account") or ""
    if reason in ("AssocGrpGRES", "AssocGrpGRESRunMinutes"):
        limit = _gpu_limit(account, "grp_tres")
        used = _gpus_in_use(job, account)
        of = f" of {limit}" if limit is not None else ""
        return (
            f"account {account or '(default)'} reached its GPU limit ({used}{of} GPUs in use);"
            " it starts when the account's running jobs free GPUs"
        )
    if reason == "AssocGrpGRESMinutes":
        limit = _gpu_limit(account, "grp_tres_mins")
        budget = f" of {limit} GPU-minutes" if limit is not None else ""
        return (
            f"account {account or '(default)'} used up its GPU budget{budget};"
            " an operator must raise it (grp_tres_mins)"
        )
    if reason.startswith(("AssocGrp", "AssocMax")):
        return f"account {account or '(default)'} reached a limit ({reason})"
    if reason in ("Resources", "Priority", "None"):
        text = _resources(job)
        if reason == "Priority":
            text += " (jobs of higher priority go first)"
        return text
    if SIMPLE.get(reason):
        return SIMPLE[reason]
    return f"Slurm says: {reason}"
