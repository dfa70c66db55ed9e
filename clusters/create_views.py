"""Creating a cluster, three ways: the step-by-step wizard, a reference architecture
adjusted before it is created, and a JSON spec (upload or paste). Each ends in
clusters.services.cluster_create; errors are shown beside the field they name."""

from __future__ import annotations

import json
import re

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from . import forms, services, wizard_forms
from .choices import OperationState
from .reference_architectures import architecture_get, architecture_list
from .spec import SpecError, validate_cluster_spec
from .views import staff_required


# --- create: shared -----------------------------------------------------------
def _path_context(path: str, spec: dict | None) -> str:
    """node_pools[1].scaling_spec.min_node_count -> "node pool 'gpu'" (what the index means)."""
    match = re.match(r"^node_pools\[([0-9]+)\]", path)
    if match and isinstance(spec, dict):
        pools = spec.get("node_pools")
        index = int(match.group(1))
        if isinstance(pools, list) and index < len(pools) and isinstance(pools[index], dict):
            pool_id = pools[index].get("id")
            return f"node pool '{pool_id}'" if isinstance(pool_id, str) and pool_id else ""
    return ""


def _spec_errors(fields: dict[str, str], spec: dict | None = None) -> list[dict]:
    return [
        {
            "path": path,
            "label": "spec" if path == "non_field_errors" else path,
            "context": _path_context(path, spec),
            "message": message,
            "step": wizard_step_for_path(path),
        }
        for path, message in fields.items()
    ]


def _created(request, operation):
    cluster = operation.cluster
    operation.refresh_from_db()
    if operation.state == OperationState.FAILED:
        messages.warning(
            request,
            f"Cluster {cluster.cluster_id} was recorded, but creating it failed: "
            f"{operation.error_message}",
        )
    elif operation.state == OperationState.SUCCEEDED:
        messages.success(request, f"Cluster {cluster.cluster_id} was created.")
    else:
        messages.success(request, f"Creating cluster {cluster.cluster_id}.")
    return redirect("clusters:cluster_detail", cluster_id=cluster.cluster_id)


def _try_create(request, spec: dict) -> tuple[object | None, list[dict]]:
    """(Operation, []) or (None, errors)."""
    try:
        return services.cluster_create(spec=spec, owner=request.user), []
    except SpecError as exc:
        return None, _spec_errors(exc.fields, spec)
    except services.ClusterConflict as exc:
        path = exc.field or "non_field_errors"
        return None, _spec_errors({path: str(exc)}, spec)


@staff_required
def create_landing(request):
    return render(request, "clusters/create_landing.html", {"architectures": architecture_list()})


# --- create: JSON upload ------------------------------------------------------
@staff_required
@require_http_methods(["GET", "POST"])
def create_json(request):
    form = forms.SpecUploadForm(request.POST or None, request.FILES or None)
    spec_errors: list[dict] = []
    if request.method == "POST" and form.is_valid():
        operation, spec_errors = _try_create(request, form.cleaned_data["spec"])
        if operation:
            return _created(request, operation)
    example = architecture_get("local-dev").build_spec(forms.suggest_cluster_id("dev"))
    return render(
        request,
        "clusters/create_json.html",
        {"form": form, "spec_errors": spec_errors, "example": json.dumps(example, indent=2)},
    )


# --- create: reference architectures -------------------------------------------
@staff_required
def create_reference(request):
    return render(request, "clusters/create_reference.html", {"architectures": architecture_list()})


@staff_required
@require_http_methods(["GET", "POST"])
def create_reference_edit(request, key: str):
    arch = architecture_get(key)
    if arch is None:
        raise Http404(f"No reference architecture '{key}'.")
    spec_errors: list[dict] = []
    if request.method == "POST":
        form = forms.ReferenceSpecForm(request.POST)
        if form.is_valid():
            operation, errors = _try_create(request, form.cleaned_data["spec"])
            if operation:
                return _created(request, operation)
            for error in errors:
                if error["path"] == "cluster_id":
                    form.add_error("cluster_id", error["message"])
                else:
                    spec_errors.append(error)
    else:
        cluster_id = forms.suggest_cluster_id(arch.spec["cluster_id"])
        form = forms.ReferenceSpecForm(
            initial={
                "cluster_id": cluster_id,
                "spec_text": json.dumps(arch.build_spec(cluster_id), indent=2),
            }
        )
    return render(
        request,
        "clusters/create_reference_edit.html",
        {"arch": arch, "form": form, "spec_errors": spec_errors},
    )


# --- create: the wizard -------------------------------------------------------
WIZARD_KEY = "mtc_cluster_wizard"
WIZARD_STEPS = (
    ("basics", "Basics"),
    ("pools", "Node pools"),
    ("network", "Network"),
    ("storage", "Storage"),
    ("slurm", "Slurm"),
    ("review", "Review"),
)
STEP_KEYS = [key for key, _ in WIZARD_STEPS]
STEP_TITLES = dict(WIZARD_STEPS)
_BASICS_FIELDS = ("cluster_id", "display_name", "provider", "zone", "labels")


def wizard_step_for_path(path: str) -> str | None:
    """Which wizard step holds the field a spec error names."""
    head = re.split(r"[.\[]", path, maxsplit=1)[0]
    if path.startswith(("node_pools", "orchestrator_spec.slurm_spec.login_node_pool_id")):
        return "pools"
    if head == "orchestrator_spec":
        return "slurm"
    if head in ("network", "storage"):
        return head
    if head in _BASICS_FIELDS:
        return "basics"
    return None


def _wizard_data(request) -> dict:
    return request.session.get(WIZARD_KEY) or {}


def _wizard_save(request, step: str, value: dict) -> None:
    data = _wizard_data(request)
    data[step] = value
    request.session[WIZARD_KEY] = data


def _first_missing_step(data: dict) -> str:
    for key in STEP_KEYS[:-1]:
        if key not in data:
            return key
    return "review"


def _compute_pool_ids(data: dict) -> list[str]:
    return [p["pool_id"] for p in data.get("pools", {}).get("compute", [])]


def _step_forms(request, step: str, data: dict) -> dict:
    """The bound (POST) or initial forms of one step."""
    post = request.POST if request.method == "POST" else None
    stored = data.get(step)
    provider = data.get("basics", {}).get("provider", "local")
    if step == "basics":
        initial = stored or {
            "cluster_id": forms.suggest_cluster_id(),
            "provider": settings.MTC_PROVIDER,
        }
        return {"form": wizard_forms.BasicsForm(post, initial=initial)}
    if step == "pools":
        if stored:
            login_initial = {k: stored[k] for k in ("login_pool_id", "login_machine_type")}
            compute_initial = stored["compute"]
        else:
            gce = provider == "gce"
            login_initial = {
                "login_pool_id": "login",
                "login_machine_type": "n2-standard-8" if gce else "local-2",
            }
            compute_initial = [
                {
                    "pool_id": "gpu",
                    "machine_type": "a3-ultragpu-8g" if gce else "local-2",
                    "accelerator_type": "NVIDIA_H200_141GB",
                    "accelerator_count": 8,
                    "node_count": 2,
                    "provisioning_model": "STANDARD",
                }
            ]
        return {
            "form": wizard_forms.LoginPoolForm(post, prefix="login", initial=login_initial),
            "formset": wizard_forms.ComputePoolFormSet(
                post, prefix="pools", initial=compute_initial
            ),
        }
    if step == "network":
        return {"form": wizard_forms.NetworkForm(post, initial=stored or {})}
    if step == "storage":
        return {"form": wizard_forms.StorageForm(post, initial=stored or {})}
    if step == "slurm":
        pool_ids = _compute_pool_ids(data)
        login_id = data.get("pools", {}).get("login_pool_id", "")
        initial = stored or {"partitions": wizard_forms.default_partitions(pool_ids)}
        return {
            "form": wizard_forms.SlurmForm(
                post, initial=initial, pool_ids=pool_ids, login_pool_id=login_id
            )
        }
    return {}


def _step_valid(step: str, step_forms: dict, data: dict) -> dict | None:
    """The step's data to store, or None when a form has errors."""
    form = step_forms["form"]
    if step == "pools":
        provider = data.get("basics", {}).get("provider", "local")
        formset = step_forms["formset"]
        if wizard_forms.check_pools(form, formset, provider):
            return wizard_forms.pools_data(form, formset)
        return None
    if not form.is_valid():
        return None
    return dict(form.cleaned_data)


def _wizard_render(request, step: str, data: dict, extra: dict) -> object:
    done = {key for key in STEP_KEYS if key in data}
    index = STEP_KEYS.index(step)
    steps = [
        {
            "key": key,
            "title": title,
            "number": i + 1,
            "current": key == step,
            "done": key in done,
            "reachable": i <= STEP_KEYS.index(_first_missing_step(data)),
        }
        for i, (key, title) in enumerate(WIZARD_STEPS)
    ]
    context = {
        "step": step,
        "step_title": STEP_TITLES[step],
        "steps": steps,
        "previous_step": STEP_KEYS[index - 1] if index else None,
        "is_last_input_step": step == "slurm",
        "provider": data.get("basics", {}).get("provider", "local"),
        "machine_suggestions": forms.MACHINE_SUGGESTIONS,
        "accelerator_suggestions": forms.ACCELERATOR_SUGGESTIONS,
        **extra,
    }
    return render(request, "clusters/wizard.html", context)


@staff_required
def wizard_start(request):
    return redirect("clusters:wizard_step", step=_first_missing_step(_wizard_data(request)))


@staff_required
@require_POST
def wizard_reset(request):
    request.session.pop(WIZARD_KEY, None)
    return redirect("clusters:wizard_step", step="basics")


@staff_required
@require_http_methods(["GET", "POST"])
def wizard_step(request, step: str):
    if step not in STEP_KEYS:
        raise Http404("No such step.")
    data = _wizard_data(request)
    first_missing = _first_missing_step(data)
    if STEP_KEYS.index(step) > STEP_KEYS.index(first_missing):
        return redirect("clusters:wizard_step", step=first_missing)
    if step == "review":
        return _wizard_review(request, data)

    step_forms = _step_forms(request, step, data)
    if request.method == "POST":
        value = _step_valid(step, step_forms, data)
        going_back = "back" in request.POST
        if value is not None:
            old_provider = data.get("basics", {}).get("provider")
            _wizard_save(request, step, value)
            if step == "basics" and old_provider and old_provider != value["provider"]:
                # Machine defaults depend on the provider: offer them again.
                fresh = _wizard_data(request)
                fresh.pop("pools", None)
                request.session[WIZARD_KEY] = fresh
            index = STEP_KEYS.index(step)
            target = STEP_KEYS[index - 1] if going_back and index else STEP_KEYS[index + 1]
            return redirect("clusters:wizard_step", step=target)
        if going_back and STEP_KEYS.index(step):
            return redirect("clusters:wizard_step", step=STEP_KEYS[STEP_KEYS.index(step) - 1])
    return _wizard_render(request, step, data, step_forms)


def _wizard_review(request, data: dict):
    try:
        spec = wizard_forms.build_spec(data)
    except (KeyError, TypeError, ValueError, ValidationError):
        # Answers stored by an older version of the wizard, or damaged: start again.
        request.session.pop(WIZARD_KEY, None)
        messages.warning(
            request, "The wizard's saved answers could not be read; please start again."
        )
        return redirect("clusters:wizard_step", step="basics")
    spec_errors: list[dict] = []
    if request.method == "POST":
        operation, spec_errors = _try_create(request, spec)
        if operation:
            request.session.pop(WIZARD_KEY, None)
            return _created(request, operation)
    else:
        try:
            validate_cluster_spec(spec)
        except SpecError as exc:
            spec_errors = _spec_errors(exc.fields, spec)
    cloud_requests = _cloud_requests(spec) if not spec_errors else []
    for error in spec_errors:
        if error["step"]:
            error["step_title"] = STEP_TITLES[error["step"]]
            error["step_url"] = reverse("clusters:wizard_step", args=[error["step"]])
    compute = data["pools"]["compute"]
    summary = {
        "nodes": sum(p["node_count"] for p in compute),
        "gpus": sum(p["node_count"] * (p.get("accelerator_count") or 0) for p in compute),
    }
    return _wizard_render(
        request,
        "review",
        data,
        {
            "spec": spec,
            "spec_json": json.dumps(spec, indent=2),
            "spec_errors": spec_errors,
            "summary": summary,
            "cloud_requests": cloud_requests,
        },
    )


def _cloud_requests(spec: dict) -> list[dict]:
    """For a gce spec, the Compute Engine requests create will send (to review)."""
    if spec.get("provider") != "gce":
        return []
    from .providers.gce.plan import split_files
    from .providers.gce.provider import plan_describe

    out = []
    for request in plan_describe(validate_cluster_spec(spec))["requests"]:
        body, files = split_files(request.get("body") or {})
        out.append({**request, "body_json": json.dumps(body, indent=2), "files": files})
    return out
