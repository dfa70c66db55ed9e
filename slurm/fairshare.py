"""Fair-share as slurmctld sees it: each account's shares and usage (`sshare`) and each
pending job's priority with its fair-share part (`sprio`). Both are read from
slurmctld's memory, so they change when its priority thread recalculates
(every PriorityCalcPeriod), not when a job starts."""

from __future__ import annotations

from dataclasses import dataclass

from .client import SlurmClient

SSHARE_FORMAT = "Account,User,RawShares,NormShares,RawUsage,EffectvUsage,LevelFS,FairShare"


@dataclass(frozen=True)
class ShareRow:
    account: str
    user: str  # "" for the account's own row
    raw_shares: str  # "1", "3", or "parent"
    norm_shares: float
    raw_usage: int  # TRES-billing seconds, decayed
    effective_usage: float
    level_fs: float  # NormShares / EffectvUsage among siblings; inf while unused
    fairshare: float


@dataclass(frozen=True)
class JobPriority:
    job_id: str
    user: str
    priority: int
    fairshare: float  # normalized fair-share factor, 0..1


def _float(value: str) -> float:
    value = value.strip()
    if value.lower() == "inf":
        return float("inf")
    try:
        return float(value)
    except ValueError:
        return 0.0


def parse_sshare(text: str) -> list[ShareRow]:
    rows = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 8:
            continue
        account, user, raw_shares, norm, usage, effective, level, fs = parts
        rows.append(
            ShareRow(
                account=account.strip(),
                user=user.strip(),
                raw_shares=raw_shares.strip(),
                norm_shares=_float(norm),
                raw_usage=int(_float(usage)),
                effective_usage=_float(effective),
                level_fs=_float(level),
                fairshare=_float(fs),
            )
        )
    return rows


def parse_sprio(text: str) -> list[JobPriority]:
    """`sprio -o %i|%u|%Y|%f` lines, highest priority first (ties: older job first,
    as the scheduler breaks them)."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        job_id, user, priority, fairshare = parts
        rows.append(
            JobPriority(
                job_id=job_id, user=user, priority=int(priority), fairshare=_float(fairshare)
            )
        )
    rows.sort(key=lambda r: (-r.priority, int(r.job_id)))
    return rows


def shares(client: SlurmClient, *, accounts: list[str]) -> list[ShareRow]:
    """The accounts' rows (and their users') from one `sshare`."""
    args = ["sshare", "--parsable2", "--noheader", "--all", f"--format={SSHARE_FORMAT}"]
    if accounts:
        args.append("--accounts=" + ",".join(accounts))
    return parse_sshare(client.run(args, timeout=15).stdout)


def priorities(client: SlurmClient) -> list[JobPriority]:
    """Every pending job's priority, highest (next to start) first."""
    out = client.run(["sprio", "--noheader", "--format=%i|%u|%Y|%f"], timeout=15).stdout
    return parse_sprio(out)
