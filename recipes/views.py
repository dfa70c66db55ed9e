"""Recipe pages: the catalog, the launch form (with the batch script it will submit
shown before launching), and the Training part of a recipe job's page.

Pages read the database only; a launch goes through recipes.launch, like the
REST API's."""

from __future__ import annotations

import json
import math
import re
import shlex
from typing import Any

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from clusters.choices import CLUSTER_LIVE_STATES
from clusters.models import Cluster
from jobs.models import Job
from jobs.selectors import job_metric_points
from jobs.views import SUBMIT_FAILURES, _cluster_or_404, _partitions, submit_failure_message

from .catalog import RECIPES, Recipe
from .forms import RecipeLaunchForm, body_digest, display_value, param_limits
from .launch import LaunchError, LaunchPlan, new_run_dir, recipe_launch, recipe_plan

# Clusters the recipes page offers to launch on.
LAUNCHABLE_STATES = ("RUNNING", "DEGRADED")
# The recipes page's badge for each recipe (the family's initial for any other).
RECIPE_MARKS = {
    "llama-pretrain": "PT",
    "gemma-pretrain": "PT",
    "continued-pretrain": "CPT",
    "sft": "SFT",
    "rl": "RL",
}
# Per-step figures drawn on a recipe job's page (the rest stay in the API's series).
SERIES_KEYS = ("loss", "tokens_per_s", "mfu", "lr", "reward")


# --- the catalog ------------------------------------------------------------------
def _param_rows(recipe: Recipe) -> list[dict]:
    return [
        {
            "name": p.name,
            "type": p.kind,
            "default": display_value(p.default),
            "limits": param_limits(p),
            "help": p.help,
            "required": p.required,
        }
        for p in recipe.params
    ]


@require_GET
def recipe_list(request):
    clusters = list(
        Cluster.objects.filter(state__in=LAUNCHABLE_STATES)
        .only("cluster_id", "display_name", "state")
        .order_by("cluster_id")
    )
    recipes = [
        {
            "id": recipe.recipe_id,
            "title": recipe.title,
            "description": recipe.description,
            "family": recipe.family,
            "mark": RECIPE_MARKS.get(recipe.recipe_id, recipe.family[:1].upper()),
            "defaults": recipe.defaults(),
            "params": _param_rows(recipe),
        }
        for recipe in RECIPES.values()
    ]
    return render(request, "jobs/recipes.html", {"recipes": recipes, "clusters": clusters})


# --- launching ----------------------------------------------------------------------
def _compute_limits(cluster: Cluster) -> tuple[int, int]:
    """Compute nodes (every pool but the login pool) and the most GPUs per node."""
    spec = cluster.spec or {}
    login = spec.get("orchestrator_spec", {}).get("slurm_spec", {}).get("login_node_pool_id")
    pools = [p for p in spec.get("node_pools", []) if p.get("id") != login]
    nodes = sum(p.get("scaling_spec", {}).get("max_node_count", 0) for p in pools)
    gpus = max((p.get("machine_spec", {}).get("accelerator_count") or 0 for p in pools), default=0)
    return nodes, gpus


def _preview(plan: LaunchPlan, body: dict) -> dict:
    sub = plan.submission
    options = [
        ("Name", sub.name),
        ("Partition", sub.partition or "the default"),
        ("Nodes", sub.nodes),
        ("GPUs per node", sub.gpus_per_node or "none"),
        ("Time limit", sub.time_limit or "the partition's"),
        ("Requeue", "yes, resuming from the last checkpoint" if sub.requeue else "no"),
        ("Register as", plan.register_as or "no (not registered)"),
    ]
    return {
        "script": plan.script,
        "run_json": json.dumps(plan.run_config, indent=2),
        "run_dir": str(plan.run_dir),
        "options": options,
        "sbatch": " ".join(shlex.quote(a) for a in plan.options or []),
        "api_body": json.dumps(body, indent=2),
    }


@require_http_methods(["GET", "POST"])
def recipe_launch_page(request, cluster_id: str, recipe: str):
    cluster = _cluster_or_404(cluster_id)
    recipe_obj = RECIPES.get(recipe)
    if recipe_obj is None:
        raise Http404(f"No recipe '{recipe}'.")
    partitions = _partitions(cluster)
    max_nodes, max_gpus = _compute_limits(cluster)
    bound = request.method == "POST"
    form = RecipeLaunchForm(
        request.POST if bound else None,
        recipe=recipe_obj,
        partitions=[p["id"] for p in partitions],
        default_partition=next((p["id"] for p in partitions if p["default"]), ""),
        default_nodes=2 if max_nodes >= 2 else 1,
        max_nodes=max_nodes,
        max_gpus=max_gpus,
    )
    cluster_ready = cluster.state in CLUSTER_LIVE_STATES
    if bound:
        form.is_valid()
    body = form.launch_body()
    plan, defaults_problem, notice = None, {}, ""
    # The previewed run directory comes back so Launch starts exactly what was shown.
    run_name = request.POST.get("run_name", "") if bound else ""
    run_dir = None
    try:
        if re.fullmatch(rf"{re.escape(recipe)}-[0-9]{{8}}-[0-9]{{6}}-[0-9a-f]{{4}}", run_name):
            run_dir = new_run_dir(cluster, recipe, owner=request.user).with_name(run_name)
        plan = recipe_plan(
            cluster=cluster, recipe_id=recipe, body=body, run_dir=run_dir, owner=request.user
        )
    except LaunchError as exc:
        if bound:
            form.add_launch_errors(exc.fields)
        else:  # the defaults alone do not make a run (a required parameter is empty)
            defaults_problem = exc.fields
    if form.errors:
        plan = None
    digest = body_digest(body)

    if bound and "launch" in request.POST and plan is not None:
        if request.POST.get("previewed") != digest:
            notice = (
                "The values changed since the script was last shown. Check the script "
                "below, then press Launch again."
            )
        elif not cluster_ready:
            form.add_error(
                None, f"Cluster '{cluster.cluster_id}' is {cluster.state}; jobs need it RUNNING."
            )
        else:
            try:
                job = recipe_launch(
                    cluster=cluster,
                    recipe_id=recipe,
                    body=body,
                    owner=request.user,
                    run_dir=plan.run_dir,
                )
            except LaunchError as exc:
                form.add_launch_errors(exc.fields)
            except SUBMIT_FAILURES as exc:
                form.add_error(None, submit_failure_message(exc))
            else:
                messages.success(
                    request, f"Launched {recipe_obj.title}: job {job.job_id} ({job.name})."
                )
                return redirect("jobs:detail", cluster.cluster_id, job.job_id)
            plan = None if form.errors else plan

    return render(
        request,
        "jobs/recipe_launch.html",
        {
            "cluster": cluster,
            "recipe": recipe_obj,
            "form": form,
            "param_fields": [
                {"field": field, "param": param, "limits": param_limits(param)}
                for field, param in form.param_fields()
            ],
            "partitions": partitions,
            "preview": _preview(plan, body) if plan is not None else None,
            "previewed": digest if plan is not None else "",
            "defaults_problem": defaults_problem,
            "notice": notice,
            "cluster_ready": cluster_ready,
            "api_path": f"/api/v1/clusters/{cluster.cluster_id}/recipes/{recipe}/launch",
        },
    )


# --- a recipe job's page -----------------------------------------------------------------
def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _finite(value: Any) -> float | None:
    number = _number(value)
    return number if number is not None and math.isfinite(number) else None


def _fmt(value: Any, spec: str) -> str:
    number = _number(value)
    if number is None:
        return "—"
    if not math.isfinite(number):
        return "NaN" if math.isnan(number) else ("∞" if number > 0 else "−∞")
    return format(number, spec)


def _percent(fraction: Any) -> str:
    number = _finite(fraction)
    if number is None:
        return _fmt(fraction, "")
    pct = 100 * number
    if pct == 0 or abs(pct) >= 10:
        return f"{pct:.1f}"
    return f"{pct:.2f}" if abs(pct) >= 0.1 else f"{pct:.2g}"


def _rate(value: Any) -> str:
    number = _finite(value)
    if number is None:
        return _fmt(value, "")
    return f"{number:,.0f}" if number >= 100 else f"{number:.1f}"


def training_figures(job: Job) -> list[dict]:
    """The summary figures (from job.metrics, which the poller keeps current)."""
    m = job.metrics if isinstance(job.metrics, dict) else {}
    params = job.parameters if isinstance(job.parameters, dict) else {}
    step, steps = _finite(m.get("step")), _finite(params.get("steps"))
    progress = None
    if steps:
        progress = max(0, min(100, round(100 * (step or 0) / steps)))
    figures = [
        {
            "key": "step",
            "label": "Step",
            "value": _fmt(step, ",.0f") if step is not None else "0",
            "unit": f"/ {steps:,.0f}" if steps else "",
            "sub": f"lr {_fmt(m['lr'], '.2e')}" if "lr" in m else "",
            "progress": progress,
        }
    ]
    loss_sub = ""
    if "first_loss" in m:
        loss_sub = f"from {_fmt(m['first_loss'], '.4f')}"
        first, last = _finite(m.get("first_loss")), _finite(m.get("last_loss"))
        if first and last is not None:
            loss_sub += f" ({100 * (last - first) / first:+.1f} %)"
    figures.append(
        {
            "key": "loss",
            "label": "Loss",
            "value": _fmt(m.get("last_loss"), ".4f"),
            "sub": loss_sub,
        }
    )
    figures.append(
        {
            "key": "tokens_per_s",
            "label": "Tokens / s",
            "value": _rate(m.get("tokens_per_s")),
            "sub": f"grad norm {_fmt(m['grad_norm'], '.3f')}" if "grad_norm" in m else "",
        }
    )
    figures.append(
        {
            "key": "mfu",
            "label": "MFU",
            "value": _percent(m.get("mfu")),
            "unit": "%" if "mfu" in m else "",
            "sub": "model FLOPs utilisation",
        }
    )
    if job.recipe == "rl" or "reward" in m:
        figures.append(
            {
                "key": "reward",
                "label": "Reward",
                "value": _fmt(m.get("reward"), ".3f"),
                "sub": "",
            }
        )
    checkpoint = m.get("last_checkpoint_step")
    resumed = m.get("resumed_from_step")
    figures.append(
        {
            "key": "checkpoint",
            "label": "Last checkpoint",
            "value": f"step {display_value(checkpoint)}" if checkpoint is not None else "none",
            "sub": f"resumed from step {display_value(resumed)}" if resumed is not None else "",
            "tone": "info" if resumed is not None else "",
        }
    )
    return figures


def training_parameters(job: Job, recipe: Recipe | None) -> list[dict]:
    """job.parameters in the catalog's order (then any others), marking the changed."""
    params = job.parameters if isinstance(job.parameters, dict) else {}
    rows, seen = [], set()
    for p in recipe.params if recipe else ():
        if p.name in params:
            value = params[p.name]
            rows.append(
                {
                    "name": p.name,
                    "value": display_value(value),
                    "changed": value != p.default,
                    "default": display_value(p.default),
                }
            )
            seen.add(p.name)
    for name in sorted(set(params) - seen, key=str):
        rows.append({"name": name, "value": display_value(params[name]), "changed": False})
    return rows


def recipe_job_context(job: Job) -> dict:
    """The Training card's context for the job page and its live fragment (no query)."""
    if not job.recipe:
        return {}
    recipe = RECIPES.get(job.recipe)
    metrics = job.metrics if isinstance(job.metrics, dict) else {}
    return {
        "training": {
            "recipe": recipe,
            "title": recipe.title if recipe else job.recipe,
            "figures": training_figures(job),
            "parameters": training_parameters(job, recipe),
            "checkpoint_dir": job.checkpoint_dir,
            "steps": _finite((job.parameters or {}).get("steps")) or "",
            "reward": job.recipe == "rl" or "reward" in metrics,
            "resumed_from_step": metrics.get("resumed_from_step"),
            "metrics_url": reverse(
                "job-metrics", kwargs={"cluster_id": job.cluster.cluster_id, "job_id": job.job_id}
            ),
        }
    }


def recipe_job_series(job: Job) -> dict:
    """The per-step series for the charts, by column, in one query (the page renders
    it with json_script; the charts then follow the REST endpoint)."""
    if not job.recipe:
        return {}
    steps: list[int] = []
    columns: dict[str, list] = {key: [] for key in SERIES_KEYS}
    # Downsampled (jobs.selectors.job_metric_points): a run may have millions of steps.
    for step, _time, values in job_metric_points(job.pk).rows:
        steps.append(step)
        for key in SERIES_KEYS:
            columns[key].append(_finite(values.get(key)))
    series = {"step": steps}
    series.update({k: v for k, v in columns.items() if any(x is not None for x in v)})
    return {"training_series": series}
