"""Reads on endpoints: who sees what, and the request figures (from the database)."""

from __future__ import annotations

import math
import os
from collections import defaultdict
from datetime import datetime, timedelta

from django.db.models import Prefetch, QuerySet
from django.utils import timezone

from identity.selectors import account_for

from . import conf
from .choices import DONE_REPLICA_STATES
from .models import Endpoint, EndpointRequest, Replica

SERIES_POINTS = 90  # buckets per chart


def endpoints_visible_to(user) -> QuerySet[Endpoint]:
    """Operators see every endpoint; a user sees only their own."""
    live = Replica.objects.exclude(state__in=DONE_REPLICA_STATES).select_related("job")
    qs = Endpoint.objects.select_related("owner", "cluster", "version__model").prefetch_related(
        Prefetch("replicas", queryset=live, to_attr="live_replicas")
    )
    return qs if user.is_staff else qs.filter(owner=user)


def openai_models(endpoint: Endpoint) -> list[dict]:
    """The model an endpoint serves, as OpenAI's /models lists one."""
    return [
        {
            "id": endpoint.served_model,
            "object": "model",
            "created": int(endpoint.version.create_time.timestamp()),
            "owned_by": endpoint.owner.get_username(),
        }
    ]


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def _summary(rows: list[tuple[float, int]], window_s: float) -> dict:
    latencies = sorted(latency for latency, status in rows if status == 200)
    return {
        "window_s": window_s,
        "requests": len(rows),
        "requests_per_s": round(len(rows) / window_s, 3),
        "errors": sum(1 for _, status in rows if status != 200),
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "p99_ms": percentile(latencies, 99),
    }


def endpoint_figures(endpoint: Endpoint, *, window_s: int = 60) -> dict:
    """Rate and latency percentiles over the last ``window_s`` seconds."""
    since = timezone.now() - timedelta(seconds=window_s)
    rows = list(
        EndpointRequest.objects.filter(endpoint=endpoint, time__gt=since).values_list(
            "latency_ms", "status"
        )
    )
    return _summary(rows, window_s)


def endpoints_figures(endpoints: list[Endpoint], *, window_s: int = 60) -> dict[int, dict]:
    """endpoint_figures for many endpoints in one query (the list page)."""
    since = timezone.now() - timedelta(seconds=window_s)
    rows: dict[int, list] = defaultdict(list)
    for endpoint_id, latency, status in EndpointRequest.objects.filter(
        endpoint__in=endpoints, time__gt=since
    ).values_list("endpoint_id", "latency_ms", "status"):
        rows[endpoint_id].append((latency, status))
    return {e.pk: _summary(rows[e.pk], window_s) for e in endpoints}


def endpoint_series(
    endpoint: Endpoint, *, window_s: int = 900, now: datetime | None = None
) -> dict:
    """Request rate, errors and p50/p95/p99 latency per time bucket, oldest first."""
    now = now or timezone.now()
    keep_s = conf.request_retention_s()
    if keep_s is not None:  # never further back than the records are kept
        window_s = max(60, min(window_s, int(keep_s)))
    bucket_s = max(2, math.ceil(window_s / SERIES_POINTS))
    start = now - timedelta(seconds=window_s)
    buckets: dict[int, list] = defaultdict(list)
    for at, latency, status in EndpointRequest.objects.filter(
        endpoint=endpoint, time__gt=start
    ).values_list("time", "latency_ms", "status"):
        buckets[int((at - start).total_seconds() // bucket_s)].append((latency, status))
    points = []
    for index in range(math.ceil(window_s / bucket_s)):
        rows = buckets.get(index, [])
        latencies = sorted(latency for latency, status in rows if status == 200)
        points.append(
            {
                "time": (start + timedelta(seconds=(index + 1) * bucket_s)).isoformat(),
                "requests_per_s": round(len(rows) / bucket_s, 3),
                "errors_per_s": round(sum(1 for _, s in rows if s != 200) / bucket_s, 3),
                "p50_ms": percentile(latencies, 50),
                "p95_ms": percentile(latencies, 95),
                "p99_ms": percentile(latencies, 99),
            }
        )
    return {"window_s": window_s, "bucket_s": bucket_s, "series": points}


def endpoint_recent_replicas(endpoint: Endpoint, *, limit: int = 10) -> QuerySet[Replica]:
    """Replicas that have ended, newest first (the page's history)."""
    return (
        endpoint.replicas.filter(state__in=DONE_REPLICA_STATES)
        .select_related("job")
        .order_by("-number")[:limit]
    )


def replica_owner_uid(endpoint: Endpoint) -> int | None:
    """The uid a replica of the endpoint runs as on this host (a local cluster): mtc
    sends the token only to a socket of that uid (serving.transport). None for a node
    elsewhere, where the node's own exclusivity is what there is."""
    if endpoint.cluster.provider != "local":
        return None
    account = account_for(user=endpoint.owner) if endpoint.owner_id else None
    return account.uid if account is not None and account.isolated else os.geteuid()
