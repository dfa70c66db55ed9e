"""The Usage page: GPU-hours, CPU-hours and job counts per user, account or partition
over time (stacked plotly bars, a table) and the same rows as CSV (jobs.usage)."""

from __future__ import annotations

import csv

from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from clusters.models import Cluster

from . import usage


def _report(request) -> tuple[dict, int]:
    """The page's context and status: 400 with the bad fields named, 404 for an
    unknown cluster, else the report for the asked (or first) cluster."""
    clusters = list(Cluster.objects.order_by("cluster_id").values_list("cluster_id", flat=True))
    params = request.GET.copy()
    if not params.get("cluster") and clusters:
        params["cluster"] = clusters[0]
    context = {"clusters": clusters, "params": params, "group_bys": usage.GROUP_BYS}
    context["buckets_choices"] = usage.BUCKETS
    if not clusters:
        return {**context, "report": None}, 200
    try:
        cluster_id, values = usage.usage_query_parse(params)
    except usage.UsageError as exc:
        return {**context, "report": None, "errors": exc.fields}, 400
    try:
        cluster = Cluster.objects.get(cluster_id=cluster_id)
    except Cluster.DoesNotExist as exc:
        raise Http404(f"No cluster '{cluster_id}'.") from exc
    report = usage.usage_report(request.user, usage.UsageQuery(cluster=cluster, **values))
    context.update(report=report, chart=_chart(report), csv_query=params.urlencode())
    return context, 200


def _chart(report: dict) -> dict:
    """One bar trace per group (GPU-hours per bucket, every bucket), for stacking."""
    index = {bucket: i for i, bucket in enumerate(report["buckets"])}
    traces: dict[str, list[float]] = {}
    for row in report["rows"]:
        y = traces.setdefault(row["group"] or "(none)", [0.0] * len(index))
        y[index[row["bucket"]]] += row["gpu_hours"]
    return {
        "x": report["buckets"],
        "traces": [{"name": name, "y": y} for name, y in traces.items()],
    }


@require_GET
def usage_page(request):
    context, status = _report(request)
    return render(request, "jobs/usage.html", context, status=status)


@require_GET
def usage_csv(request):
    context, status = _report(request)
    if status != 200 or context["report"] is None:
        return render(request, "jobs/usage.html", context, status=status)
    report = context["report"]
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    name = f"usage-{report['cluster']}-{report['start']}-{report['end']}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    writer = csv.writer(response)
    writer.writerows(usage.usage_csv_lines(report))
    return response
