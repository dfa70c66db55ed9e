"""Registry pages: the model list and a model's page (versions, aliases, lineage)."""

from __future__ import annotations

import math
from typing import Any

from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import render
from django.views.decorators.http import require_GET

from . import selectors
from .models import ModelVersion, VersionState

PAGE_SIZE = 50
COMPARE_MAX = 10  # versions put in the "Compare versions" link, newest
STATE_TONES = {VersionState.READY: "ok", VersionState.PENDING: "info", VersionState.FAILED: "bad"}
# The final figures a versions row shows, in order: (metrics key, label, format).
METRIC_COLUMNS = (
    ("last_loss", "loss", ".4f"),
    ("reward", "reward", ".3f"),
    ("step", "steps", ",.0f"),
    ("tokens_per_s", "tok/s", ",.0f"),
)


def _figure(value: Any, spec: str) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return format(value, spec)


def version_figures(version: ModelVersion) -> list[tuple[str, str]]:
    metrics = version.metrics if isinstance(version.metrics, dict) else {}
    shown = []
    for key, label, spec in METRIC_COLUMNS:
        text = _figure(metrics.get(key), spec)
        if text is not None:
            shown.append((label, text))
    return shown


@require_GET
def model_list(request):
    query = request.GET.get("q", "").strip()[:100]
    page = Paginator(selectors.models_for_list(query=query), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    return render(request, "registry/model_list.html", {"page": page, "q": query})


@require_GET
def model_detail(request, name: str):
    model = selectors.models_for_list().filter(name=name).first()
    if model is None:
        raise Http404(f"No model '{name}'.")
    versions = list(selectors.versions_of(model))
    rows = [
        {
            "version": v,
            "tone": STATE_TONES.get(v.state, "muted"),
            "figures": version_figures(v),
            "aliases": sorted(a.alias for a in v.aliases.all()),
        }
        for v in reversed(versions)  # newest first
    ]
    chains = [c for c in selectors.model_lineage(versions) if len(c) > 1]
    compare = [f"{model.name}@{v.number}" for v in versions[-COMPARE_MAX:]]
    return render(
        request,
        "registry/model_detail.html",
        {
            "model": model,
            "rows": rows,
            "aliases": sorted(model.aliases.all(), key=lambda a: a.alias),
            "chains": chains,
            "compare_url": "/jobs/compare/?versions=" + ",".join(compare)
            if len(compare) > 1
            else "",
        },
    )
