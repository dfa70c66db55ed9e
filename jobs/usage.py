"""Usage: GPU-hours, CPU-hours and job counts per user, account or partition and per day
or week, from the accounting figures stored on finished jobs (never a sacct call).

A job counts whole in the bucket of the day (UTC) it ended: its GPU-hours are
allocated GPUs x elapsed / 3600 and its CPU-hours allocated CPUs x elapsed / 3600
(sacct's CPUTimeRAW). The database does the sums, grouped by group and bucket, so a
request runs the same few queries however many jobs the window holds."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from django.db.models import (
    BigIntegerField,
    Count,
    ExpressionWrapper,
    F,
    Q,
    QuerySet,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce, TruncDay, TruncWeek

from clusters.models import Cluster
from mtc.fielderrors import FieldErrors

from .models import Job

GROUP_BYS = ("user", "account", "partition")
BUCKETS = ("day", "week")
DEFAULT_DAYS = 30
MAX_DAYS = 3 * 366  # a window's buckets are listed one by one


class UsageError(FieldErrors):
    """A usage request with bad parameters (``fields`` names each)."""


@dataclass(frozen=True)
class UsageQuery:
    cluster: Cluster
    group_by: str
    bucket: str
    start: date
    end: date  # inclusive


CLUSTER_ID_RE = re.compile(r"[a-z][a-z0-9-]{0,30}")
# Dates far outside these would overflow a window's arithmetic (date.max + 1 day).
FIRST_DAY, LAST_DAY = date(1970, 1, 1), date(9000, 12, 31)
DATE_HINT = f"Must be a date, YYYY-MM-DD, from {FIRST_DAY} to {LAST_DAY}."


def _date(text: str) -> date | None:
    try:
        day = date.fromisoformat(text)
    except ValueError:
        return None
    return day if FIRST_DAY <= day <= LAST_DAY else None


def usage_query_parse(params, *, today: date | None = None) -> tuple[str, dict]:
    """The query string's values, checked: (cluster id, values), or UsageError naming
    each bad field. The cluster is looked up by the caller (unknown: 404)."""
    today = today or datetime.now(UTC).date()
    fields: dict[str, str] = {}
    cluster_id = (params.get("cluster") or "").strip()
    if not cluster_id:
        fields["cluster"] = "Required: the cluster's id."
    elif not CLUSTER_ID_RE.fullmatch(cluster_id):
        fields["cluster"] = "Must be a cluster id: a-z, 0-9 and -, starting with a letter."
    group_by = params.get("group_by") or "user"
    if group_by not in GROUP_BYS:
        fields["group_by"] = f"Must be one of {', '.join(GROUP_BYS)}."
    bucket = params.get("bucket") or "day"
    if bucket not in BUCKETS:
        fields["bucket"] = f"Must be one of {', '.join(BUCKETS)}."
    end = _date(params.get("end") or today.isoformat())
    if end is None:
        fields["end"] = DATE_HINT
    raw_start = params.get("start")
    start = _date(raw_start) if raw_start else (end or today) - timedelta(days=DEFAULT_DAYS - 1)
    if start is None:
        fields["start"] = DATE_HINT
    if start and end:
        if start > end:
            fields["start"] = "Must be on or before end."
        elif (end - start).days >= MAX_DAYS:
            fields["start"] = f"The window may span at most {MAX_DAYS} days."
    if fields:
        raise UsageError(fields)
    return cluster_id, {"group_by": group_by, "bucket": bucket, "start": start, "end": end}


def _bucket_start(day: date, bucket: str) -> date:
    return day - timedelta(days=day.weekday()) if bucket == "week" else day


def _buckets(query: UsageQuery) -> list[date]:
    step = timedelta(days=7 if query.bucket == "week" else 1)
    day, last = _bucket_start(query.start, query.bucket), query.end
    out = []
    while day <= last:
        out.append(day)
        day += step
    return out


def usage_jobs(user, cluster: Cluster, start: date, end: date) -> QuerySet[Job]:
    """The finished jobs of the window that ``user`` may count: operators every one,
    a user their own and those of the accounts they are a member of. An array's own
    row is left out when its tasks have rows (they carry the usage; the array's row
    folds theirs)."""
    begin = datetime.combine(start, time.min, tzinfo=UTC)
    stop = datetime.combine(end + timedelta(days=1), time.min, tzinfo=UTC)
    tasks = Job.objects.filter(cluster=cluster, array_task_id__isnull=False)
    qs = Job.objects.filter(
        cluster=cluster, elapsed_s__isnull=False, end_time__gte=begin, end_time__lt=stop
    ).exclude(array_task_id__isnull=True, job_number__in=tasks.values("job_number"))
    if user.is_staff:
        return qs
    return qs.filter(Q(owner=user) | Q(account__in=user.slurm_accounts.values("name")))


def usage_report(user, query: UsageQuery) -> dict:
    """Rows per (group, bucket), per group and in all, hours rounded to 6 places."""
    trunc = TruncWeek if query.bucket == "week" else TruncDay
    big = BigIntegerField()
    gpu_s = ExpressionWrapper(Coalesce("gpus_allocated", Value(0)) * F("elapsed_s"), big)
    cpu_s = ExpressionWrapper(Coalesce("cpus_allocated", "cpus") * F("elapsed_s"), big)
    rows = (
        usage_jobs(user, query.cluster, query.start, query.end)
        .annotate(group=F(query.group_by), period=trunc("end_time", tzinfo=UTC))
        .values("group", "period")
        .annotate(gpu_s=Sum(gpu_s), cpu_s=Sum(cpu_s), jobs=Count("id"))
        .order_by("group", "period")
    )
    out_rows, groups = [], {}
    for row in rows:
        period = row["period"]
        day = period.date() if isinstance(period, datetime) else period
        figures = {
            "gpu_hours": round((row["gpu_s"] or 0) / 3600, 6),
            "cpu_hours": round((row["cpu_s"] or 0) / 3600, 6),
            "jobs": row["jobs"],
        }
        out_rows.append({"group": row["group"], "bucket": day.isoformat(), **figures})
        total = groups.setdefault(row["group"], {"gpu_s": 0, "cpu_s": 0, "jobs": 0})
        total["gpu_s"] += row["gpu_s"] or 0
        total["cpu_s"] += row["cpu_s"] or 0
        total["jobs"] += row["jobs"]

    def hours(total: dict) -> dict:
        return {
            "gpu_hours": round(total["gpu_s"] / 3600, 6),
            "cpu_hours": round(total["cpu_s"] / 3600, 6),
            "jobs": total["jobs"],
        }

    everything = {key: sum(t[key] for t in groups.values()) for key in ("gpu_s", "cpu_s", "jobs")}
    return {
        "cluster": query.cluster.cluster_id,
        "group_by": query.group_by,
        "bucket": query.bucket,
        "start": query.start.isoformat(),
        "end": query.end.isoformat(),
        "attribution": "end",
        "buckets": [day.isoformat() for day in _buckets(query)],
        "rows": out_rows,
        "groups": [{"group": name, **hours(total)} for name, total in groups.items()],
        "totals": hours(everything),
    }


CSV_HEADER = ("group", "bucket", "gpu_hours", "cpu_hours", "jobs")


def usage_csv_lines(report: dict) -> list[list]:
    """The report's rows as CSV lines, the header first."""
    lines: list[list] = [[f"{report['group_by']}", *CSV_HEADER[1:]]]
    for row in report["rows"]:
        lines.append([row["group"], row["bucket"], row["gpu_hours"], row["cpu_hours"], row["jobs"]])
    return lines
