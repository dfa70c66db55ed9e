"""Endpoint pages: the list, deploy, one endpoint (replicas, charts, a "try it" box)
and delete. Pages read the database; writes go through serving.services."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from registry.models import ModelAlias, ModelVersion, VersionState

from . import selectors, services
from .choices import EndpointState
from .deploy import DeployError, endpoint_validate
from .forms import EndpointDeployForm
from .models import Endpoint

REFRESH_MS = 3000


def _endpoint_or_404(request, endpoint_id: int) -> Endpoint:
    try:
        return selectors.endpoints_visible_to(request.user).get(pk=endpoint_id)
    except Endpoint.DoesNotExist as exc:
        raise Http404(f"No endpoint {endpoint_id}.") from exc


def endpoint_list(request):
    endpoints = list(selectors.endpoints_visible_to(request.user))
    figures = selectors.endpoints_figures(endpoints)
    for endpoint in endpoints:
        endpoint.figures = figures[endpoint.pk]
        endpoint.ready_count = sum(1 for r in endpoint.live_replicas if r.state == "READY")
    return render(request, "serving/endpoint_list.html", {"endpoints": endpoints})


def _version_options() -> list[dict]:
    """Hints for the version box: every READY version and alias, by model."""
    options = [
        {"value": str(number), "label": f"{model} version {number}"}
        for model, number in ModelVersion.objects.filter(state=VersionState.READY).values_list(
            "model__name", "number"
        )
    ]
    options += [
        {"value": alias, "label": f"{model} alias -> version {number}"}
        for model, alias, number in ModelAlias.objects.values_list(
            "model__name", "alias", "version__number"
        )
    ]
    return options


def endpoint_deploy(request):
    form = EndpointDeployForm(request.POST or None, initial=request.GET.dict() or None)
    if request.method == "POST":
        form.is_valid()
        try:
            plan = endpoint_validate(form.deploy_data())
        except DeployError as exc:
            form.add_deploy_errors(exc)
        else:
            endpoint = services.endpoint_create(plan=plan, owner=request.user)
            messages.success(request, f"Deploying {plan.version} as endpoint {endpoint.name}.")
            return redirect("serving:endpoint_detail", endpoint.pk)
    return render(
        request,
        "serving/endpoint_deploy.html",
        {"form": form, "version_options": _version_options()},
    )


def _detail_context(request, endpoint: Endpoint) -> dict:
    replicas = endpoint.live_replicas
    return {
        "endpoint": endpoint,
        "replicas": replicas,
        "ready_count": sum(1 for r in replicas if r.state == "READY"),
        "past_replicas": list(selectors.endpoint_recent_replicas(endpoint)),
        "figures": selectors.endpoint_figures(endpoint),
        "events": list(endpoint.events.all()[:15]),
        "refresh_ms": REFRESH_MS,
        "deleting": endpoint.state == EndpointState.DELETING,
    }


def endpoint_detail(request, endpoint_id: int):
    endpoint = _endpoint_or_404(request, endpoint_id)
    context = _detail_context(request, endpoint)
    context["series"] = selectors.endpoint_series(endpoint)
    return render(request, "serving/endpoint_detail.html", context)


@require_POST
def endpoint_delete(request, endpoint_id: int):
    endpoint = _endpoint_or_404(request, endpoint_id)
    services.endpoint_delete(endpoint=endpoint, actor=request.user)
    messages.success(request, f"Deleting endpoint {endpoint.name}: its replicas are being stopped.")
    return redirect("serving:endpoint_list")
