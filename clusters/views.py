"""Cluster pages: dashboard, list, detail (with a live fragment), retry and delete
(creating a cluster is in clusters.create_views). Pages read the database only; writes
go through clusters.services."""

from __future__ import annotations

import json
from collections import Counter
from functools import wraps
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from mtc.templatetags.mtc_ui import NODE_GROUP_LABELS, NODE_GROUPS, node_group

from . import forms, selectors, services
from .choices import OPERATION_ACTIVE_STATES, ClusterState, OperationKind, OperationState
from .extensions import cluster_detail_context
from .models import Cluster
from .node_grid import node_grid_tiles
from .providers import ProviderError, get_provider

CLUSTERS_PER_PAGE = 50
DASHBOARD_CLUSTERS = 24
# Cluster states in which something is changing: pages refresh themselves.
BUSY_CLUSTER_STATES = {ClusterState.CREATING, ClusterState.UPDATING, ClusterState.DELETING}


def staff_required(view):
    """Operators only (docs/api.md): others get the 403 page."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not request.user.is_staff:
            raise PermissionDenied("Only operators (staff users) can create or delete clusters.")
        return view(request, *args, **kwargs)

    return wrapper


def _cluster_or_404(cluster_id: str) -> Cluster:
    try:
        return selectors.cluster_get(cluster_id)
    except Cluster.DoesNotExist as exc:
        raise Http404(f"No cluster '{cluster_id}'.") from exc


def _group_counts(states) -> list[dict]:
    counts = Counter()
    for state, n in states:
        counts[node_group(state)] += n
    return [
        {"group": g, "label": NODE_GROUP_LABELS[g], "count": counts[g]}
        for g in NODE_GROUPS
        if counts[g]
    ]


# --- read pages ---------------------------------------------------------------
def dashboard(request):
    clusters = list(selectors.clusters_with_nodes()[:DASHBOARD_CLUSTERS])
    state_counts = selectors.node_state_counts()
    cluster_states = selectors.cluster_state_counts()
    total_clusters = sum(cluster_states.values())
    for cluster in clusters:
        nodes = list(cluster.nodes.all())
        cluster.node_groups = _group_counts(Counter(n.slurm_state for n in nodes).items())
        cluster.node_list = nodes
    context = {
        "clusters": clusters,
        "total_clusters": total_clusters,
        "more_clusters": max(0, total_clusters - len(clusters)),
        "cluster_states": [
            (s, cluster_states[s]) for s in ClusterState.values if s in cluster_states
        ],
        "node_total": sum(state_counts.values()),
        "node_groups": _group_counts(state_counts.items()),
        "node_states": sorted(state_counts.items()),
        "gpu_total": selectors.gpu_total(),
        "operations": selectors.operations_recent(8),
        "live": selectors.operations_active_exist(),
    }
    return render(request, "clusters/dashboard.html", context)


def cluster_list(request):
    q = request.GET.get("q", "").strip()[:100]
    state = request.GET.get("state", "")
    if state not in ClusterState.values:
        state = ""
    paginator = Paginator(selectors.cluster_search(q=q, state=state), CLUSTERS_PER_PAGE)
    page = paginator.get_page(request.GET.get("page"))
    query = urlencode({k: v for k, v in (("q", q), ("state", state)) if v})
    return render(
        request,
        "clusters/cluster_list.html",
        {
            "page": page,
            "clusters": page.object_list,
            "q": q,
            "state": state,
            "states": ClusterState.values,
            "filter_query": query,
        },
    )


def _live_context(cluster: Cluster) -> dict:
    """What changes while the cluster works: state, pools, nodes, operations."""
    nodes = selectors.cluster_node_tiles(cluster)
    operations = selectors.cluster_operations(cluster)
    active = next(
        (
            op
            for op in operations
            if op.state in OPERATION_ACTIVE_STATES
            and not (op.kind == OperationKind.REPAIR_NODE and op.state == OperationState.PENDING)
        ),
        None,
    )  # a repair waiting for approval or its turn is not work in progress
    if active is None and cluster.state in BUSY_CLUSTER_STATES:
        active = selectors.cluster_active_operation(cluster)
    per_pool = Counter(n.pool_id for n in nodes)
    ready_per_pool = Counter(
        n.pool_id for n in nodes if node_group(n.slurm_state) in ("idle", "busy")
    )
    pools = sorted(cluster.pools.all(), key=lambda p: (not p.is_login, p.pool_id))
    for pool in pools:
        pool.node_count = per_pool[pool.pk]
        pool.ready_count = ready_per_pool[pool.pk]
    pool_by_id = {p.pool_id: p for p in pools}
    partitions = []
    slurm = cluster.spec.get("orchestrator_spec", {}).get("slurm_spec", {})
    for part in slurm.get("partitions", []):
        members = [pool_by_id[p] for p in part.get("node_pool_ids", []) if p in pool_by_id]
        partitions.append(
            {
                "id": part.get("id", ""),
                "pools": part.get("node_pool_ids", []),
                "default": part.get("default", False),
                "node_count": sum(p.node_count for p in members),
                "gpu_count": sum(p.node_count * p.accelerator_count for p in members),
            }
        )
    return {
        "cluster": cluster,
        "nodes": nodes,
        "node_tiles": node_grid_tiles(cluster, nodes),
        "node_groups": _group_counts(Counter(n.slurm_state for n in nodes).items()),
        "pools": pools,
        "partitions": partitions,
        "operations": operations,
        "active_operation": active,
        "live": active is not None,
        # A delete that failed (e.g. its provider is missing) may be tried again.
        "can_delete": cluster.state != ClusterState.DELETING or active is None,
        "emulated": any(n.gpus_emulated for n in nodes),
    }


def cluster_detail(request, cluster_id: str):
    cluster = _cluster_or_404(cluster_id)
    context = _live_context(cluster)
    dashboard_url = ""
    try:
        provider = get_provider(cluster.provider)
        login_command = provider.login_command(cluster)
        login_error = ""
        dashboard_url = provider.dashboard_url(cluster)
    except ProviderError as exc:
        login_command, login_error = "", str(exc)
    context.update(
        {
            "login_command": login_command,
            "dashboard_url": dashboard_url,
            "login_error": login_error,
            "labels": sorted(cluster.labels.items()),
            "spec_json": json.dumps(cluster.spec, indent=2),
            # Cards of the apps above (the Jobs card), a fixed number of queries each.
            **cluster_detail_context(request, cluster),
        }
    )
    return render(request, "clusters/cluster_detail.html", context)


def cluster_fragment(request, cluster_id: str):
    """The live part of the detail page, fetched again while an Operation runs."""
    cluster = _cluster_or_404(cluster_id)
    return render(request, "clusters/_cluster_live.html", _live_context(cluster))


# --- retry and delete -------------------------------------------------------------
@staff_required
@require_POST
def cluster_retry(request, cluster_id: str):
    cluster = _cluster_or_404(cluster_id)
    try:
        operation = services.cluster_retry(cluster=cluster, owner=request.user)
    except services.ClusterConflict as exc:
        messages.error(request, str(exc))
    else:
        messages.success(
            request, f"Retrying cluster {cluster.cluster_id} (operation {operation.pk})."
        )
    return redirect("clusters:cluster_detail", cluster_id=cluster.cluster_id)


# --- delete -------------------------------------------------------------------
@staff_required
@require_http_methods(["GET", "POST"])
def cluster_delete(request, cluster_id: str):
    cluster = _cluster_or_404(cluster_id)
    form = forms.DeleteConfirmForm(request.POST or None, cluster_id=cluster.cluster_id)
    if request.method == "POST" and form.is_valid():
        operation = services.cluster_delete(cluster=cluster, owner=request.user)
        operation.refresh_from_db()
        if operation.state == OperationState.FAILED:
            messages.error(
                request,
                f"Deleting cluster {cluster.cluster_id} failed: {operation.error_message}",
            )
        elif Cluster.objects.filter(pk=cluster.pk).exists():
            messages.success(
                request, f"Deleting cluster {cluster.cluster_id} (operation {operation.pk})."
            )
        else:
            messages.success(request, f"Cluster {cluster.cluster_id} was deleted.")
        return redirect("clusters:cluster_list")
    return render(request, "clusters/cluster_delete.html", {"cluster": cluster, "form": form})
