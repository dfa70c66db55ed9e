"""Node-health pages: one node (checks, failures, repairs, charts over its recent
reports) and the operators' repair queue with fleet figures. Pages read the database
only; the two writes (request a repair, approve one) go through health.services."""

from __future__ import annotations

import math
from collections import Counter
from functools import wraps

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from clusters.models import Node
from mtc.templatetags.mtc_ui import human_duration
from slurm.queue import JOB_ID_RE

from . import selectors, services
from .choices import REPAIR_ACTIVE_STATES, RepairAction, RepairState
from .metrics import node_series
from .metrics import num as _num
from .models import HealthReport, Repair
from .policy import mode_for, next_action

# What an operator may ask for from the node page (drain-only repairs come from policy).
OPERATOR_ACTIONS = (RepairAction.REBOOT, RepairAction.REIMAGE, RepairAction.REPLACE)
ACTION_HELP = {
    RepairAction.REBOOT: "restart the node (local: its slurmd)",
    RepairAction.REIMAGE: "wipe the node's state and start it fresh",
    RepairAction.REPLACE: "a new machine under the same name",
}
LIVE_MS = 3000  # pages refresh this often while a repair runs
IDLE_MS = 15000  # ... and this often while one waits


def operator_required(view):
    """Operators (staff users) only: others get the 403 page."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not request.user.is_staff:
            raise PermissionDenied("Only operators (staff users) can see and act on repairs.")
        return view(request, *args, **kwargs)

    return wrapper


def _node_or_404(cluster_id: str, node_name: str) -> Node:
    try:
        return selectors.node_get(cluster_id, node_name)
    except Node.DoesNotExist as exc:
        raise Http404(f"No node '{node_name}' on cluster '{cluster_id}'.") from exc


# --- reading reports ------------------------------------------------------------------
def _fmt(value, digits: int = 2) -> str:
    number = _num(value)
    if number is None:
        return str(value)
    return f"{number:,.{digits}f}".rstrip("0").rstrip(".") if digits else f"{number:,.0f}"


def _scalar_items(details: dict, limit: int = 3) -> list[str]:
    items = []
    for key, value in details.items():
        if isinstance(value, (str, int, float, bool)) and value != "":
            items.append(f"{key}: {value}")
        if len(items) >= limit:
            break
    return items


def check_summary(name: str, details) -> list[str]:
    """The few details of a check worth a glance, as short lines."""
    if not isinstance(details, dict):
        return []
    lines = []
    for key in ("reason", "error"):
        if details.get(key):
            lines.append(str(details[key]))
    if name == "disk":
        paths = details.get("paths") if isinstance(details.get("paths"), dict) else {}
        for path, info in list(paths.items())[:4]:
            if not isinstance(info, dict):
                continue
            if "error" in info:
                lines.append(f"{path}: {info['error']}")
            else:
                lines.append(
                    f"{path}: {_fmt(info.get('free_gb'))} GiB free "
                    f"({_fmt(info.get('free_pct'), 1)}%) of {_fmt(info.get('total_gb'))} GiB"
                )
    elif name == "gpu":
        count, expected = details.get("count"), details.get("expected")
        if count is not None:
            lines.append(
                f"{count} GPU{'s' if count != 1 else ''} visible"
                + (f" of {expected} expected" if expected is not None else "")
            )
        lost = details.get("lost")
        if isinstance(lost, list) and lost:
            lines.append(f"{len(lost)} unreachable")
    elif name == "ecc":
        gpus = details.get("gpus")
        if isinstance(gpus, list):
            lines.append(f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''} read")
    elif name == "xid":
        if details.get("source"):
            lines.append(f"source: {details['source']}")
        if details.get("new_count") is not None:
            lines.append(f"{details['new_count']} new XID line(s)")
    elif name == "dcgm":
        level, trigger = details.get("level"), details.get("trigger")
        why = f" ({trigger})" if trigger else ""
        diag = details.get("diag") if isinstance(details.get("diag"), dict) else {}
        if diag:
            tests = diag.get("tests") if isinstance(diag.get("tests"), list) else []
            failed = diag.get("failed") if isinstance(diag.get("failed"), list) else []
            lines.append(
                f"diag -r {level if level is not None else '?'}{why}: "
                f"{len(tests)} tests, {len(failed)} failed"
            )
        elif level is not None:
            lines.append(f"level {level}{why}")
        health = details.get("health") if isinstance(details.get("health"), dict) else {}
        if health.get("overall"):
            lines.append(f"health: {health['overall']}")
    elif name == "speed":
        if _num(details.get("gflops")) is not None:
            lines.append(
                f"{_fmt(details['gflops'], 3)} GFLOP/s"
                + (
                    f" ({details.get('size')}×{details.get('size')}, "
                    f"{details.get('iterations')} iterations)"
                    if details.get("size")
                    else ""
                )
            )
        tool = details.get("gpu_tool") if isinstance(details.get("gpu_tool"), dict) else {}
        if _num(tool.get("gflops")) is not None:
            lines.append(
                f"GPU tool: {_fmt(tool['gflops'], 2)} GFLOP/s"
                + (" (emulated)" if tool.get("emulated") else "")
            )
    elif name == "correctness":
        if "reference" in details and "cpu" in details:
            same = details.get("reference") == details.get("cpu")
            lines.append("CPU checksum matches the reference" if same else "CPU checksum differs")
        tool = details.get("gpu_tool") if isinstance(details.get("gpu_tool"), dict) else {}
        results = tool.get("results") if isinstance(tool.get("results"), list) else []
        if results:
            lines.append(
                f"{len(results)} GPU result(s)" + (" (emulated)" if tool.get("emulated") else "")
            )
    else:
        lines += _scalar_items(details)
    return lines[:5]


def _findings(items) -> list[dict]:
    out = []
    for f in items if isinstance(items, list) else []:
        if isinstance(f, dict) and f.get("code"):
            code = str(f["code"])
            out.append(
                {
                    "code": code,
                    "severity": f.get("severity") or mode_for(code).severity,
                    "message": str(f.get("message") or ""),
                    "gpu": f.get("gpu"),
                }
            )
    return out


def check_rows(report: HealthReport | None) -> list[dict]:
    """The report's checks as table rows; findings the server added (e.g. SLOW_NODE,
    judged against the pool) are shown with the check they belong to."""
    if report is None:
        return []
    extra: dict[str, list[dict]] = {}
    for f in report.findings if isinstance(report.findings, list) else []:
        if isinstance(f, dict) and f.get("check"):
            extra.setdefault(str(f["check"]), []).append(f)
    rows = []
    for check in report.checks if isinstance(report.checks, list) else []:
        if not isinstance(check, dict):
            continue
        name = str(check.get("name") or "?")
        findings = _findings(check.get("findings"))
        codes = {f["code"] for f in findings}
        findings += [
            {**f, "judged": True} for f in _findings(extra.get(name)) if f["code"] not in codes
        ]
        duration, budget = _num(check.get("duration_s")), _num(check.get("budget_s"))
        details = check.get("details") if isinstance(check.get("details"), dict) else {}
        level = _num(details.get("level")) if name == "dcgm" else None
        rows.append(
            {
                "name": name,
                # dcgmi diag's level, chosen by why the checks ran (health.policy).
                "dcgm_level": int(level) if level is not None else None,
                "trigger": str(details.get("trigger") or "") if name == "dcgm" else "",
                "status": str(check.get("status") or "?"),
                "duration": duration,
                "budget": budget,
                "budget_pct": (
                    min(100, round(100 * duration / budget))
                    if duration is not None and budget
                    else None
                ),
                "over_budget": bool(duration is not None and budget and duration > budget),
                "details": check_summary(name, check.get("details")),
                "findings": findings,
                "source": report.source,
            }
        )
    return rows


def _attach_modes(failures) -> None:
    for failure in failures:
        mode = mode_for(failure.mode)
        failure.meaning = mode.meaning
        failure.ladder = mode.ladder


def _attach_jobs(repairs) -> None:
    for repair in repairs:
        jobs = []
        for item in repair.jobs_requeued if isinstance(repair.jobs_requeued, list) else []:
            if isinstance(item, dict) and item.get("job_id") is not None:
                job_id = str(item["job_id"])
                jobs.append(
                    {
                        "job_id": job_id,
                        "steps_lost": item.get("steps_lost"),
                        "linkable": bool(JOB_ID_RE.fullmatch(job_id)),
                    }
                )
        repair.jobs = jobs
        if repair.start_time and repair.end_time:
            repair.took = human_duration((repair.end_time - repair.start_time).total_seconds())


# --- the node page ----------------------------------------------------------------------
def node_detail(request, cluster_id: str, node_name: str):
    node = _node_or_404(cluster_id, node_name)
    reports = selectors.node_reports(node)
    agent_report = next((r for r in reports if r.source == "agent"), None)
    other_report = next((r for r in reports if r.source != "agent"), None)
    failures_open = selectors.node_failures_open(node)
    failures_past = selectors.node_failures_past(node)
    _attach_modes(failures_open)
    _attach_modes(failures_past)
    repairs = selectors.node_repairs(node)
    _attach_jobs(repairs)
    active_repair = next((r for r in repairs if r.state in REPAIR_ACTIVE_STATES), None)
    suggested = None
    if failures_open:
        first = failures_open[0]
        suggested = next_action(first.mode, first.repair_attempts)
    series = node_series(node, reports)
    context = {
        "node": node,
        "cluster": node.cluster,
        "pool": node.pool,
        "agent_report": agent_report,
        "other_report": other_report,
        "checks": check_rows(agent_report) + check_rows(other_report),
        "failures_open": failures_open,
        "failures_past": failures_past,
        "repairs": repairs,
        "active_repair": active_repair,
        "actions": [
            {"value": a, "label": a.label, "help": ACTION_HELP[a], "selected": a == suggested}
            for a in OPERATOR_ACTIONS
        ],
        "suggested_action": suggested,
        "series": series,
        "fabric": selectors.node_fabric_result(node),
        "report_count": len(reports),
        "has_speed": bool(series["speed"]["time"]),
        "has_gpus": bool(series["gpus"]),
        "has_host": bool(series["host"]["time"] or series["disk"]["time"]),
        # Follow a repair while it is on its way; otherwise the page stays as it is (so
        # the repair form is never swapped under an operator's hand).
        "refresh_ms": (
            (LIVE_MS if active_repair.state == RepairState.RUNNING else IDLE_MS)
            if active_repair
            else 0
        ),
    }
    return render(request, "health/node.html", context)


@operator_required
@require_POST
def node_repair(request, cluster_id: str, node_name: str):
    node = _node_or_404(cluster_id, node_name)
    action = request.POST.get("action", "")
    if action not in OPERATOR_ACTIONS:
        messages.error(request, "Choose reboot, reimage or replace.")
    else:
        try:
            repair = services.repair_request(node=node, action=action, requested_by=request.user)
        except services.RepairConflict as exc:
            messages.error(request, str(exc))
        else:
            state = Repair.objects.filter(pk=repair.pk).values_list("state", flat=True).first()
            messages.success(
                request,
                f"Repair requested: {action} {node.name} "
                f"({(state or repair.state).replace('_', ' ').lower()}).",
            )
    return redirect("health:node", cluster_id=cluster_id, node_name=node.name)


# --- the repair queue ---------------------------------------------------------------------
def _budget(repair: Repair, running_per_pool: Counter) -> dict:
    size = repair.pool_size or 0
    allowed = max(1, math.floor(repair.cluster.repair_max_fraction * size))
    return {
        "pool": repair.node.pool.pool_id,
        "size": size,
        "allowed": allowed,
        "running": running_per_pool[repair.node.pool_id],
        "fraction": repair.cluster.repair_max_fraction,
    }


@operator_required
def repair_queue(request):
    clusters = selectors.clusters_for_filter()
    cluster_id = request.GET.get("cluster", "")
    if cluster_id not in {c for c, _ in clusters}:
        cluster_id = ""
    active = selectors.repairs_active(cluster_id)
    for repair in active:
        repair.failure_meaning = mode_for(repair.failure.mode).meaning if repair.failure else ""
    pending = [r for r in active if r.state == RepairState.PENDING_APPROVAL]
    waiting = [r for r in active if r.state == RepairState.WAITING]
    running = [r for r in active if r.state == RepairState.RUNNING]
    running_per_pool = Counter(r.node.pool_id for r in running)
    for repair in waiting:
        repair.budget = _budget(repair, running_per_pool)
    history = selectors.repairs_history(cluster_id)
    _attach_jobs(history)
    _attach_jobs(running)

    by_mode = selectors.failures_by_mode(cluster_id)
    top = max((n for _, n in by_mode), default=0)
    mttr, mttr_n = selectors.mean_time_to_repair(cluster_id)
    outcomes = selectors.repairs_by_outcome(cluster_id)
    good = selectors.goodput(cluster_id)
    context = {
        "clusters": clusters,
        "cluster_id": cluster_id,
        "pending": pending,
        "waiting": waiting,
        "running": running,
        "history": history,
        "history_limit": selectors.REPAIR_HISTORY,
        "failure_modes": [
            {
                "mode": mode,
                "count": n,
                "meaning": mode_for(mode).meaning,
                "severity": mode_for(mode).severity,
                "pct": round(100 * n / top) if top else 0,
            }
            for mode, n in by_mode
        ],
        "failures_total": sum(n for _, n in by_mode),
        "mttr": mttr,
        "mttr_n": mttr_n,
        "outcomes": [(state, outcomes[state]) for state in RepairState.values],
        "outcomes_total": sum(outcomes.values()),
        "goodput": good,
        "goodput_pct": round(100 * good["goodput"], 1) if good["goodput"] is not None else None,
        "goodput_hours": {
            k: good[f"{k}_gpu_s"] / 3600 for k in ("held", "lost", "restart", "redo")
        },
        "window_days": selectors.fleet_window_days(),
        "refresh_ms": LIVE_MS if running else IDLE_MS,
        "next_url": request.get_full_path(),
    }
    return render(request, "health/repairs.html", context)


@operator_required
@require_POST
def repair_approve(request, repair_id: int):
    repair = Repair.objects.select_related("cluster", "node").filter(pk=repair_id).first()
    if repair is None:
        raise Http404(f"No repair {repair_id}.")
    try:
        repair = services.repair_approve(repair=repair, approved_by=request.user)
    except services.RepairConflict as exc:
        messages.error(request, str(exc))
    else:
        messages.success(
            request,
            f"Approved: {repair.action} {repair.node.name} "
            f"({repair.state.replace('_', ' ').lower()}).",
        )
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        target = reverse("health:repairs")
    return redirect(target)
