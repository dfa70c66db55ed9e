"""The experiment comparison page:
/jobs/compare/?jobs=<cluster>/<job>,...&versions=<model>@<n>,..."""

from __future__ import annotations

from django.shortcuts import render
from django.views.decorators.http import require_GET

from .compare import MAX_RUNS, comparison_build


@require_GET
def job_compare(request):
    comparison = comparison_build(
        user=request.user,
        job_values=request.GET.getlist("jobs"),
        version_values=request.GET.getlist("versions"),
    )
    return render(
        request,
        "jobs/compare.html",
        {
            "comparison": comparison,
            "runs": comparison.runs,
            "chart_data": {"charts": comparison.charts},
            "max_runs": MAX_RUNS,
            "jobs_value": ",".join(comparison.job_keys),
            "versions_value": ",".join(comparison.version_keys),
        },
    )
