"""Experiment comparison: several recipe jobs and model versions side by side — their
per-step curves overlaid and their setup and parameters in one table, differences marked.

Reads only, in a constant number of queries however many runs are picked: the jobs
(one), the versions (one), every run's metric points (one) and the picker's jobs (one).
A version's curves are its source job's."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.db.models import Q
from django.urls import reverse

from jobs import selectors
from jobs.models import Job
from registry.models import ModelVersion

from .catalog import RECIPES
from .forms import display_value

MAX_RUNS = 12
MAX_POINTS = 2000  # per curve; longer runs are thinned evenly (the last point is kept)
JOB_REF_RE = re.compile(r"^(?P<cluster>[a-z][a-z0-9-]{0,30})/(?P<job>[0-9]+(?:_[0-9]+)?)$")
VERSION_REF_RE = re.compile(r"^(?P<model>[a-z0-9][a-z0-9._-]{0,62})@(?P<number>[1-9][0-9]{0,8})$")
# (JobMetric key, chart title): loss and reward first, what a comparison is mostly for.
CURVES = (
    ("loss", "Loss"),
    ("reward", "Reward"),
    ("lr", "Learning rate"),
    ("grad_norm", "Gradient norm"),
    ("tokens_per_s", "Tokens / s"),
)
# (job.metrics key, label): the outcome of each run; not marked as differences.
RESULTS = (
    ("step", "Steps run"),
    ("first_loss", "First loss"),
    ("last_loss", "Final loss"),
    ("reward", "Final reward"),
    ("tokens_per_s", "Tokens / s"),
    ("mfu", "MFU"),
    ("last_checkpoint_step", "Last checkpoint"),
)
COLORS = (
    "#2457d6",
    "#d6402b",
    "#15803d",
    "#a15c07",
    "#7c3aed",
    "#0e7490",
    "#be185d",
    "#4d7c0f",
    "#9a3412",
    "#334155",
    "#0891b2",
    "#6d28d9",
)
_MISSING = object()


@dataclass
class Run:
    key: str  # "t1/123" or "tiny-llama@2": what the URL names
    job: Job | None = None
    version: ModelVersion | None = None
    color: str = ""
    remove_url: str = ""

    @property
    def label(self) -> str:
        job = self.job
        if self.version is not None:
            name = f"{self.version.model.name}@{self.version.number}"
            return f"{name} ({job.cluster.cluster_id}/{job.job_id})" if job else name
        return f"{job.cluster.cluster_id}/{job.job_id} · {job.name}" if job else self.key

    @property
    def parameters(self) -> dict:
        source = self.version.parameters if self.version and self.version.parameters else None
        if source is None and self.job is not None:
            source = self.job.parameters
        return source if isinstance(source, dict) else {}

    @property
    def recipe(self) -> str:
        if self.job is not None and self.job.recipe:
            return self.job.recipe
        return self.version.recipe if self.version is not None else ""

    @property
    def results(self) -> dict:
        source = self.job.metrics if self.job is not None else self.version.metrics
        return source if isinstance(source, dict) else {}


@dataclass
class Comparison:
    runs: list[Run] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    setup_rows: list[dict] = field(default_factory=list)
    parameter_rows: list[dict] = field(default_factory=list)
    result_rows: list[dict] = field(default_factory=list)
    charts: list[dict] = field(default_factory=list)
    candidates: list[Job] = field(default_factory=list)
    job_keys: list[str] = field(default_factory=list)
    version_keys: list[str] = field(default_factory=list)

    @property
    def differences(self) -> int:
        return sum(row["differs"] for row in self.setup_rows + self.parameter_rows)


# --- the query string -----------------------------------------------------------------
def _split(values: list[str]) -> list[str]:
    """`?jobs=a,b&jobs=c` → [a, b, c] without repeats (the picker's form adds a jobs= each)."""
    seen: dict[str, None] = {}
    for value in values:
        for part in value.split(","):
            if part.strip():
                seen.setdefault(part.strip(), None)
    return list(seen)


def compare_url(job_keys: list[str], version_keys: list[str]) -> str:
    params = []
    if job_keys:
        params.append(("jobs", ",".join(job_keys)))
    if version_keys:
        params.append(("versions", ",".join(version_keys)))
    query = urlencode(params, safe="/,@")
    return reverse("recipes:compare") + (f"?{query}" if query else "")


# --- looking the runs up ------------------------------------------------------------
def versions_by_refs(user, refs: list[tuple[str, int]]) -> dict[tuple[str, int], ModelVersion]:
    """{(model name, number): version} for the versions the user may see, in one query:
    operators see all; a user those of their models, made by them or from their jobs."""
    if not refs:
        return {}
    match = Q()
    for name, number in refs:
        match |= Q(model__name=name, number=number)
    qs = (
        ModelVersion.objects.filter(match)
        .select_related("model", "source_job__cluster")
        .defer("source_job__script", "source_job__cluster__spec")
    )
    if not user.is_staff:
        qs = qs.filter(Q(model__owner=user) | Q(created_by=user) | Q(source_job__owner=user))
    return {(v.model.name, v.number): v for v in qs}


def _resolve(user, job_values: list[str], version_values: list[str]) -> Comparison:
    comparison = Comparison()
    job_keys, version_keys = _split(job_values), _split(version_values)
    if len(job_keys) + len(version_keys) > MAX_RUNS:
        comparison.problems.append(
            f"At most {MAX_RUNS} runs can be compared; the first {MAX_RUNS} are shown."
        )
        job_keys = job_keys[:MAX_RUNS]
        version_keys = version_keys[: MAX_RUNS - len(job_keys)]

    job_refs: dict[str, tuple[str, str]] = {}
    for key in job_keys:
        if m := JOB_REF_RE.fullmatch(key):
            job_refs[key] = (m["cluster"], m["job"])
        else:
            comparison.problems.append(
                f"“{key}” is not a job: write <cluster id>/<job id>, e.g. demo/123."
            )
    version_refs: dict[str, tuple[str, int]] = {}
    for key in version_keys:
        if m := VERSION_REF_RE.fullmatch(key):
            version_refs[key] = (m["model"], int(m["number"]))
        else:
            comparison.problems.append(
                f"“{key}” is not a model version: write <model>@<number>, e.g. tiny-llama@2."
            )

    jobs = selectors.jobs_by_refs(user, list(job_refs.values()))
    versions = versions_by_refs(user, list(version_refs.values()))
    by_job_pk: dict[int, Run] = {}
    for key, ref in job_refs.items():
        job = jobs.get(ref)
        if job is None:
            # Unknown and someone else's read the same: existence is not disclosed.
            comparison.problems.append(f"No job {key} that you can see.")
            continue
        run = Run(key=key, job=job)
        comparison.runs.append(run)
        comparison.job_keys.append(key)
        by_job_pk[job.pk] = run
    for key, ref in version_refs.items():
        version = versions.get(ref)
        if version is None:
            comparison.problems.append(f"No model version {key} that you can see.")
            continue
        comparison.version_keys.append(key)
        same_job = by_job_pk.get(version.source_job_id) if version.source_job_id else None
        if same_job is not None:  # picked twice (as a job and as its version): one run
            same_job.version = version
            continue
        run = Run(key=key, job=version.source_job, version=version)
        comparison.runs.append(run)
        if version.source_job_id:
            by_job_pk[version.source_job_id] = run
    for index, run in enumerate(comparison.runs):
        run.color = COLORS[index % len(COLORS)]
        others_jobs = [k for k in comparison.job_keys if k != run.key]
        others_versions = [
            k
            for k in comparison.version_keys
            if k != run.key and not (run.version and k == _version_key(run.version))
        ]
        run.remove_url = compare_url(others_jobs, others_versions)
    return comparison


def _version_key(version: ModelVersion) -> str:
    return f"{version.model.name}@{version.number}"


# --- the table -------------------------------------------------------------------------
def _canonical(value: Any) -> str:
    if value is _MISSING:
        return "\0missing"
    return json.dumps(value, sort_keys=True, default=str)


def _row(label: str, values: list[Any], *, mark: bool, code: bool = False) -> dict:
    differs = mark and len(values) > 1 and len({_canonical(v) for v in values}) > 1
    return {
        "label": label,
        "code": code,
        "cells": ["—" if v is _MISSING else display_value(v) for v in values],
        "differs": differs,
    }


def _parameter_order(runs: list[Run]) -> list[str]:
    """The recipes' catalog order (of the runs' recipes, in turn), then the rest sorted."""
    names: dict[str, None] = {}
    for run in runs:
        recipe = RECIPES.get(run.recipe)
        for param in recipe.params if recipe else ():
            names.setdefault(param.name, None)
    present = {name for run in runs for name in run.parameters}
    ordered = [name for name in names if name in present]
    return ordered + sorted(present - set(ordered), key=str)


def _tables(comparison: Comparison) -> None:
    runs = comparison.runs

    def job_field(attr: str) -> list[Any]:
        """The jobs' values of attr; empty or no job reads as missing."""
        values = [getattr(r.job, attr) if r.job is not None else _MISSING for r in runs]
        return [_MISSING if v == "" else v for v in values]

    comparison.setup_rows = [
        _row(
            "Cluster",
            [r.job.cluster.cluster_id if r.job else _MISSING for r in runs],
            mark=True,
            code=True,
        ),
        _row("Recipe", [r.recipe or _MISSING for r in runs], mark=True, code=True),
        _row(
            "Model version",
            [_version_key(r.version) if r.version else _MISSING for r in runs],
            mark=False,
            code=True,
        ),
        _row("Nodes", job_field("nodes"), mark=True),
        _row("GPUs per node", job_field("gpus_per_node"), mark=True),
        _row("Partition", job_field("partition"), mark=True),
    ]
    comparison.parameter_rows = [
        _row(name, [r.parameters.get(name, _MISSING) for r in runs], mark=True, code=False)
        for name in _parameter_order(runs)
    ]
    comparison.result_rows = [_row("State", job_field("state"), mark=False)] + [
        _row(label, [r.results.get(key, _MISSING) for r in runs], mark=False)
        for key, label in RESULTS
        if any(key in r.results for r in runs)
    ]


# --- the curves ----------------------------------------------------------------------------
def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _thin(points: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    if len(points) <= MAX_POINTS:
        return points
    stride = math.ceil(len(points) / MAX_POINTS)
    thinned = points[::stride]
    return thinned if thinned[-1] is points[-1] else [*thinned, points[-1]]


def _charts(comparison: Comparison) -> None:
    job_runs = [r for r in comparison.runs if r.job is not None]
    # Bounded per run (a run may have millions of steps), in one query for them all.
    by_job = selectors.job_metric_series([r.job for r in job_runs], points=MAX_POINTS)
    series = {pk: [(step, values) for step, _t, values in rows] for pk, rows in by_job.items()}
    for key, title in CURVES:
        traces = []
        for run in job_runs:
            points = _thin(series.get(run.job.pk, []))
            y = [_finite(values.get(key)) for _step, values in points]
            if any(v is not None for v in y):
                traces.append(
                    {
                        "name": run.label,
                        "run": run.key,
                        "color": run.color,
                        "x": [step for step, _values in points],
                        "y": y,
                    }
                )
        if traces:
            comparison.charts.append({"metric": key, "title": title, "traces": traces})


def comparison_build(*, user, job_values: list[str], version_values: list[str]) -> Comparison:
    """The comparison of the runs named by ?jobs= and ?versions= that the user may see;
    what cannot be shown is said in .problems."""
    comparison = _resolve(user, job_values, version_values)
    _tables(comparison)
    _charts(comparison)
    chosen = {r.job.pk for r in comparison.runs if r.job is not None}
    comparison.candidates = [
        job for job in selectors.recipe_jobs_recent(user) if job.pk not in chosen
    ]
    return comparison
