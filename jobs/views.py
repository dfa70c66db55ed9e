"""Job pages: the queue (filters, state counts, sorting, pages, a live fragment),
submit, one job (history, output tail, controls), and the control actions.

Pages read the database only (the poller keeps it current); writes go through
jobs.services, like the REST API's."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from clusters.accounts import AccountError
from clusters.models import Cluster
from clusters.providers.base import ProviderError
from clusters.runroot import NoRunRoot
from identity.sources.base import IdentityMissing
from slurm import SlurmError
from slurm.hostlist import expand_hostlist
from slurm.queue import JOB_ID_RE
from slurm.submit import SubmissionError

from . import selectors, services
from .choices import ACTIVE_STATES, HELD_REASONS, TERMINAL_STATES, JobState
from .extensions import job_card_context, job_series_context
from .filtersets import JobFilterSet
from .forms import EXAMPLES, FIELD_NAMES, JobSubmitForm
from .models import Job
from .pending import pending_explanation

JOBS_PER_PAGE = 50
REFRESH_MS = 3000
FILTER_KEYS = ("name", "user", "owner", "partition")
# ?sort= keys -> ORDER BY (ascending, descending); job id (newest first) is the default.
SORTS = {
    "job_id": (("job_number", "array_task_id"), ("-job_number", "array_task_id")),
    "submit_time": (
        ("submit_time", "job_number", "array_task_id"),
        ("-submit_time", "-job_number", "array_task_id"),
    ),
    "state": (
        ("state", "-job_number", "array_task_id"),
        ("-state", "-job_number", "array_task_id"),
    ),
    "name": (("name", "-job_number", "array_task_id"), ("-name", "-job_number", "array_task_id")),
}
DEFAULT_SORT = "-job_id"
SORT_COLUMNS = {"job_id": "Job id", "name": "Name", "state": "State", "submit_time": "Submitted"}
ASCENDING_FIRST = {"name", "state"}  # the others read newest first
STATE_ORDER = list(JobState.values)


# --- lookups -------------------------------------------------------------------
def _cluster_or_404(cluster_id: str) -> Cluster:
    try:
        return Cluster.objects.get(cluster_id=cluster_id)
    except Cluster.DoesNotExist as exc:
        raise Http404(f"No cluster '{cluster_id}'.") from exc


def _job_or_404(request, cluster: Cluster, job_id: str, *, events: bool = False) -> Job:
    if not JOB_ID_RE.fullmatch(job_id):
        raise Http404("A job id looks like 123 or 123_4.")
    qs = selectors.jobs_visible_to(request.user, cluster)
    if events:
        qs = qs.prefetch_related("events")
    try:
        job = qs.get(job_id=job_id)
    except Job.DoesNotExist as exc:
        raise Http404(f"No job {job_id} on cluster '{cluster.cluster_id}'.") from exc
    job.cluster = cluster
    return job


def allowed_actions(job: Job) -> list[str]:
    """The controls the job's state allows, by the same rules as services.job_control."""
    held = job.reason in HELD_REASONS
    actions = []
    for action, (states, _verb) in services.ACTIONS.items():
        if job.state not in states:
            continue
        if (action == "release" and not held) or (action == "hold" and held):
            continue
        actions.append(action)
    return actions


# What a submit (a form's or a recipe launch's) can fail with once its input is valid.
# NoRunRoot: a gce cluster with no shared storage for job output (a cluster-level fault).
SUBMIT_FAILURES = (services.JobConflict, SlurmError, ProviderError, IdentityMissing, NoRunRoot)


def submit_failure_message(exc: Exception) -> str:
    """The form-level message for a submit that Slurm or the cluster refused."""
    if isinstance(exc, SlurmError):
        prefix = "Slurm refused the job" if exc.permanent else "Slurm is not answering"
        return f"{prefix}: {exc}"
    return str(exc)


def _partitions(cluster: Cluster) -> list[dict]:
    """The cluster's partitions from its spec: id, default, nodes and GPUs per node."""
    spec = cluster.spec or {}
    pools = {p.get("id"): p for p in spec.get("node_pools", [])}
    slurm = spec.get("orchestrator_spec", {}).get("slurm_spec", {})
    partitions = []
    for part in slurm.get("partitions", []):
        members = [pools[i] for i in part.get("node_pool_ids", []) if i in pools]
        partitions.append(
            {
                "id": part.get("id", ""),
                "default": part.get("default", False),
                "nodes": sum(m.get("scaling_spec", {}).get("max_node_count", 0) for m in members),
                "gpus_per_node": max(
                    (m.get("machine_spec", {}).get("accelerator_count") or 0 for m in members),
                    default=0,
                ),
            }
        )
    return partitions


# --- the queue -------------------------------------------------------------------
def _query(params: list[tuple[str, str]]) -> str:
    return urlencode(params)


def _queue_context(request, cluster: Cluster) -> dict:
    is_staff = request.user.is_staff
    data = request.GET.copy()
    if not is_staff:
        data.pop("owner", None)  # users see only their own jobs anyway
    filterset = JobFilterSet(data, queryset=selectors.jobs_for_list(request.user, cluster))
    form = filterset.form
    form.is_valid()
    cleaned = getattr(form, "cleaned_data", {})
    states = [s for s in STATE_ORDER if s in set(cleaned.get("state") or [])]

    # Every filter but the state: the chips count what each state would show.
    qs = filterset.queryset
    for key in FILTER_KEYS:
        value = cleaned.get(key)
        if value not in (None, ""):
            qs = filterset.filters[key].filter(qs, value)
    counts = selectors.job_state_counts(qs)  # one GROUP BY query
    total_all = sum(counts.values())
    if states:
        qs = qs.filter(state__in=states)
        total = sum(counts.get(s, 0) for s in states)
    else:
        total = total_all

    sort = request.GET.get("sort", DEFAULT_SORT)
    key = sort.lstrip("-")
    if key not in SORTS or sort.count("-") > 1:
        sort, key = DEFAULT_SORT, DEFAULT_SORT.lstrip("-")
    descending = sort.startswith("-")
    qs = qs.order_by(*SORTS[key][1 if descending else 0])

    paginator = Paginator(qs, JOBS_PER_PAGE)
    paginator.count = total  # known from the counts: no COUNT(*) query
    page = paginator.get_page(request.GET.get("page"))
    jobs = list(page.object_list)  # the one query for the rows
    for job in jobs:
        job.cluster = cluster

    # Links keep the other filters: chips toggle a state, headers set the sort.
    filters = [(k, str(data.get(k, "")).strip()) for k in FILTER_KEYS]
    filters = [(k, v) for k, v in filters if v and (k != "owner" or is_staff)]
    sort_param = [] if sort == DEFAULT_SORT else [("sort", sort)]
    base = reverse("jobs:queue", args=[cluster.cluster_id])

    def url(state_list, sort_list=sort_param, page_number=None):
        params = filters + [("state", s) for s in state_list] + list(sort_list)
        if page_number and page_number > 1:
            params.append(("page", str(page_number)))
        query = _query(params)
        return f"{base}?{query}" if query else base

    shown = [s for s in STATE_ORDER if counts.get(s) or s in states]
    chips = [
        {
            "state": s,
            "count": counts.get(s, 0),
            "active": s in states,
            "url": url([x for x in states if x != s] if s in states else [*states, s]),
        }
        for s in shown
    ]
    active_count = sum(n for s, n in counts.items() if s in ACTIVE_STATES)
    headers = []
    for column, label in SORT_COLUMNS.items():
        current = key == column
        if current:
            next_sort = column if descending else f"-{column}"
        else:
            next_sort = column if column in ASCENDING_FIRST else f"-{column}"
        headers.append(
            {
                "key": column,
                "label": label,
                "url": url(states, [] if next_sort == DEFAULT_SORT else [("sort", next_sort)]),
                "direction": ("desc" if descending else "asc") if current else "",
            }
        )
    query_now = request.GET.urlencode()
    return {
        "cluster": cluster,
        "jobs": jobs,
        "page": page,
        "total": total,
        "total_all": total_all,
        "active_count": active_count,
        "chips": chips,
        "all_url": url([]),
        "states": states,
        "filters": dict(filters),
        "filtered": bool(filters or states),
        "clear_url": base if sort == DEFAULT_SORT else f"{base}?{_query(sort_param)}",
        "sort": sort,
        "headers": {h["key"]: h for h in headers},
        "prev_url": url(states, page_number=page.number - 1) if page.has_previous() else "",
        "next_url": url(states, page_number=page.number + 1) if page.has_next() else "",
        "fragment_url": reverse("jobs:queue_fragment", args=[cluster.cluster_id])
        + (f"?{query_now}" if query_now else ""),
        "partitions": [p["id"] for p in _partitions(cluster)],
        "refresh_ms": REFRESH_MS,
        "filter_errors": form.errors,
        # The chips count the jobs kept; operators also see how many the purge removed
        # (all of the cluster's, whoever's: a user's own count is not kept).
        "retention_days": selectors.jobs_retention_days(),
        "jobs_purged": selectors.jobs_purged_count(cluster) if is_staff else None,
    }


@require_GET
def job_queue(request, cluster_id: str):
    cluster = _cluster_or_404(cluster_id)
    return render(request, "jobs/queue.html", _queue_context(request, cluster))


@require_GET
def job_queue_fragment(request, cluster_id: str):
    """The live part of the queue page (chips, table, pages), fetched every few seconds."""
    cluster = _cluster_or_404(cluster_id)
    return render(request, "jobs/_queue_live.html", _queue_context(request, cluster))


# --- submit ----------------------------------------------------------------------
@require_http_methods(["GET", "POST"])
def job_submit(request, cluster_id: str):
    cluster = _cluster_or_404(cluster_id)
    partitions = _partitions(cluster)
    default = next((p["id"] for p in partitions if p["default"]), "")
    form = JobSubmitForm(
        request.POST or None, partitions=[p["id"] for p in partitions], default_partition=default
    )
    if request.method == "POST":
        form.is_valid()
        submission = None
        try:
            submission = services.job_validate(cluster=cluster, data=form.submission_data())
        except SubmissionError as exc:
            form.add_submission_errors(exc)
        if submission is not None and not form.errors:
            try:
                job = services.job_submit(
                    cluster=cluster, owner=request.user, submission=submission
                )
            except SUBMIT_FAILURES as exc:
                form.add_error(None, submit_failure_message(exc))
            except AccountError as exc:  # an account that is not theirs
                form.add_submission_errors(exc)
            else:
                messages.success(request, f"Submitted job {job.job_id} ({job.name}).")
                return redirect("jobs:detail", cluster.cluster_id, job.job_id)
    return render(
        request,
        "jobs/submit.html",
        {
            "cluster": cluster,
            "form": form,
            "partitions": partitions,
            "examples": EXAMPLES,
            "cluster_ready": cluster.state in ("RUNNING", "DEGRADED", "UPDATING"),
        },
    )


# --- one job ---------------------------------------------------------------------
OPTION_LABELS = {
    "name": "Name",
    "partition": "Partition",
    "nodes": "Nodes",
    "ntasks_per_node": "Tasks per node",
    "gpus_per_node": "GPUs per node",
    "cpus_per_task": "CPUs per task",
    "time_limit": "Time limit",
    "requeue": "Requeue",
    "dependency": "Dependency",
    "array": "Array",
}


def _job_context(request, cluster: Cluster, job: Job) -> dict:
    events = list(job.events.all())
    return {
        **job_card_context(job),  # e.g. the Training card of a recipe job (no query)
        "cluster": cluster,
        "job": job,
        "events": events,
        "node_names": expand_hostlist(job.node_list),
        "actions": allowed_actions(job),
        "held": job.reason in HELD_REASONS,
        "pending_explanation": pending_explanation(job),
        "active": job.state in ACTIVE_STATES,
        "terminal": job.state in TERMINAL_STATES,
        "refresh_ms": REFRESH_MS if job.state not in TERMINAL_STATES else 0,
        "fragment_url": reverse("jobs:detail_fragment", args=[cluster.cluster_id, job.job_id]),
    }


@require_GET
def job_detail(request, cluster_id: str, job_id: str):
    cluster = _cluster_or_404(cluster_id)
    job = _job_or_404(request, cluster, job_id, events=True)
    context = _job_context(request, cluster, job)
    options = dict(job.options or {})
    env = options.pop("env", {}) or {}
    shown = [(OPTION_LABELS.get(k, k), options[k]) for k in FIELD_NAMES if k in options]
    shown += [(k, v) for k, v in sorted(options.items()) if k not in FIELD_NAMES]
    context.update(
        {
            **job_series_context(job),  # e.g. a recipe job's chart data (one query)
            "options": shown,
            "hangs": list(job.hangs.all()) if job.recipe else [],  # recipes/hang.py
            "env": sorted(env.items()) if isinstance(env, dict) else [],
            "output_url": reverse(
                "job-output", kwargs={"cluster_id": cluster.cluster_id, "job_id": job.job_id}
            ),
        }
    )
    return render(request, "jobs/job_detail.html", context)


@require_GET
def job_detail_fragment(request, cluster_id: str, job_id: str):
    """The live part of the job page (state, controls, fields, history)."""
    cluster = _cluster_or_404(cluster_id)
    job = _job_or_404(request, cluster, job_id, events=True)
    return render(request, "jobs/_job_live.html", _job_context(request, cluster, job))


@require_POST
def job_action(request, cluster_id: str, job_id: str, action: str):
    if action not in services.ACTIONS:
        raise Http404(f"No action '{action}'.")
    cluster = _cluster_or_404(cluster_id)
    job = _job_or_404(request, cluster, job_id)
    try:
        services.job_control(job=job, action=action, actor=request.user)
    except services.JobConflict as exc:
        messages.error(request, str(exc))
    except SlurmError as exc:
        messages.error(request, f"Slurm is not answering, try again: {exc}")
    except ProviderError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Asked Slurm to {action} job {job.job_id}.")
    return redirect("jobs:detail", cluster.cluster_id, job.job_id)
