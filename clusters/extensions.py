"""Places where apps above clusters add to cluster pages, so clusters never imports them.

The jobs app registers the cluster page's Jobs card here from its AppConfig.ready().
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest

from .models import Cluster

ClusterContext = Callable[[HttpRequest, Cluster], dict]

# The cluster detail page (each part: a fixed number of queries).
cluster_detail_parts: list[ClusterContext] = []


def cluster_detail_context(request: HttpRequest, cluster: Cluster) -> dict:
    context: dict = {}
    for part in cluster_detail_parts:
        context.update(part(request, cluster))
    return context
