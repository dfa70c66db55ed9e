"""Chart series for the node page, from the node's stored reports: the speed check, per-GPU
telemetry (the agent's gpu check), host figures (its host check: CPU, load, memory,
network from /proc) and disk use (its disk check).

``node_series(node, reports)`` is the one entry point, so that a provider with a monitoring
service of its own (Cloud Monitoring on gce) can supply the GPU series behind the same call;
``sources`` says where each part came from."""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING

from django.core.cache import cache
from django.utils import timezone

if TYPE_CHECKING:
    from clusters.models import Node

    from .models import HealthReport

GPU_METRICS = ("temperature_c", "power_w", "utilization_pct", "memory_used_mib")
HOST_METRICS = (
    "cpu_util_pct",
    "load1",
    "cpu_count",
    "mem_used_pct",
    "mem_used_mib",
    "net_rx_mbps",
    "net_tx_mbps",
)


def num(value) -> float | None:
    """A finite number from a report's JSON, else None ("[N/A]", strings, bools)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(str(value).strip())
        except (TypeError, ValueError):
            return None
    value = float(value)
    return value if math.isfinite(value) else None


def _checks(report: HealthReport) -> Iterable[tuple[str, dict]]:
    for check in report.checks if isinstance(report.checks, list) else []:
        if isinstance(check, dict):
            details = check.get("details")
            yield str(check.get("name") or ""), details if isinstance(details, dict) else {}


def _rate(now: float | None, before: float | None, seconds: float) -> float | None:
    """MB/s between two byte counters; None across a counter reset (a reboot)."""
    if now is None or before is None or seconds <= 0 or now < before:
        return None
    return round((now - before) / seconds / 1e6, 4)


def agent_series(reports: list[HealthReport]) -> dict:
    """Every series the node's own agent reports, oldest first."""
    speed: dict[str, list] = {"time": [], "gflops": []}
    gpus: dict[int, dict] = {}
    host: dict[str, list] = {"time": [], **{m: [] for m in HOST_METRICS}}
    disk: dict = {"time": [], "paths": {}}
    last_net: tuple[float, float | None, float | None] | None = None
    for report in reversed(reports):
        stamp = report.time.isoformat()
        for name, details in _checks(report):
            if name == "speed":
                gflops = num(details.get("gflops"))
                if gflops is not None:
                    speed["time"].append(stamp)
                    speed["gflops"].append(gflops)
            elif name == "gpu" and isinstance(details.get("telemetry"), list):
                for row in details["telemetry"]:
                    index = num(row.get("index")) if isinstance(row, dict) else None
                    if index is None:
                        continue
                    series = gpus.setdefault(
                        int(index),
                        {"index": int(index), "time": [], **{m: [] for m in GPU_METRICS}},
                    )
                    series["time"].append(stamp)
                    for metric in GPU_METRICS:
                        series[metric].append(num(row.get(metric)))
            elif name == "host" and num(details.get("cpu_util_pct")) is not None:
                total, avail = (
                    num(details.get("mem_total_mib")),
                    num(details.get("mem_available_mib")),
                )
                used = total - avail if total and avail is not None else None
                rx, tx = num(details.get("net_rx_bytes")), num(details.get("net_tx_bytes"))
                seconds = report.time.timestamp()
                rates = (None, None)
                if last_net is not None:
                    span = seconds - last_net[0]
                    rates = (_rate(rx, last_net[1], span), _rate(tx, last_net[2], span))
                last_net = (seconds, rx, tx)
                values = {
                    "cpu_util_pct": num(details.get("cpu_util_pct")),
                    "load1": num(details.get("load1")),
                    "cpu_count": num(details.get("cpu_count")),
                    "mem_used_pct": round(100 * used / total, 2) if used is not None else None,
                    "mem_used_mib": used,
                    "net_rx_mbps": rates[0],
                    "net_tx_mbps": rates[1],
                }
                host["time"].append(stamp)
                for metric in HOST_METRICS:
                    host[metric].append(values[metric])
            elif name == "disk" and isinstance(details.get("paths"), dict):
                at = len(disk["time"])
                disk["time"].append(stamp)
                for path, info in details["paths"].items():
                    free = num(info.get("free_pct")) if isinstance(info, dict) else None
                    used = disk["paths"].setdefault(str(path), [None] * at)
                    used.append(round(100 - free, 2) if free is not None else None)
                for used in disk["paths"].values():
                    used.extend([None] * (at + 1 - len(used)))  # a path this report lacked
    return {
        "speed": speed,
        "gpus": [gpus[i] for i in sorted(gpus)],
        "host": host,
        "disk": {
            "time": disk["time"],
            "paths": [{"path": p, "used_pct": v} for p, v in sorted(disk["paths"].items())],
        },
    }


def node_series(node: Node, reports: list[HealthReport]) -> dict:
    """The node page's chart series from its recent reports (newest first, as stored).

    {"speed": {time, gflops}, "gpus": [{index, time, <GPU_METRICS>}], "host": {time,
    <HOST_METRICS>}, "disk": {time, paths: [{path, used_pct}]}, "sources": {gpu, host},
    "host_shared": bool}. Local nodes all run on this machine, so their host figures are
    the machine's (``host_shared``)."""
    series = agent_series(reports)
    series["sources"] = {"gpu": "agent", "host": "agent"}
    series["host_shared"] = node.cluster.provider == "local"
    if node.cluster.provider == "gce":
        gpus, error = cloud_gpu_series(node)
        series["sources"]["gpu"] = "cloud-monitoring"
        series["gpu_error"] = error
        if gpus:
            series["gpus"] = gpus
    return series


CLOUD_WINDOW = timedelta(hours=6)
CLOUD_CACHE_S = 60  # Cloud Monitoring aligns to the minute: one read a minute per node


def cloud_gpu_series(node: Node) -> tuple[list[dict], str]:
    """A gce node's GPU series from the Ops Agent's DCGM metrics in Cloud Monitoring
    (cached for a minute, so a page refresh does not read it again); and an error to
    show instead when it cannot be read."""
    from clusters.providers.base import ProviderError
    from clusters.providers.gce.monitoring import CloudMonitoring

    project = (node.cluster.provider_state or {}).get("project")
    if not project:
        return [], "The cluster has not reached Compute Engine yet."
    key = f"mtc:gpu-series:{node.cluster.cluster_id}:{node.name}"
    cached = cache.get(key)
    if cached is not None:
        return cached, ""
    now = timezone.now()
    try:
        gpus = CloudMonitoring(project).gpu_series(node.name, since=now - CLOUD_WINDOW, until=now)
    except ProviderError as exc:
        return [], str(exc)
    cache.set(key, gpus, CLOUD_CACHE_S)
    return gpus, ""
