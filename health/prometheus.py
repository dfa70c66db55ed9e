"""GET /metrics: the fleet in Prometheus' text format, read from the database."""

from __future__ import annotations

import logging
import math

from django.db.models import Count, Max
from django.http import HttpResponse
from rest_framework.views import APIView

from clusters.models import Cluster, Node
from jobs.models import Job
from mtc.models import RetentionTally

from .models import HealthReport, NodeFailure, Repair

log = logging.getLogger(__name__)

# (metric, help, field in the gpu check's telemetry, scale)
GPU_GAUGES = (
    ("mtc_gpu_temperature_celsius", "GPU temperature", "temperature_c", 1),
    ("mtc_gpu_power_watts", "GPU power draw", "power_w", 1),
    ("mtc_gpu_utilization_ratio", "GPU utilization", "utilization_pct", 0.01),
    ("mtc_gpu_memory_used_bytes", "GPU memory used", "memory_used_mib", 2**20),
    (
        "mtc_gpu_ecc_uncorrected_volatile",
        "Volatile uncorrectable ECC errors",
        "ecc_uncorrected_volatile",
        1,
    ),
)


# Host figures from the agent's host check (/proc).
HOST_GAUGES = (
    ("mtc_node_cpu_utilization_ratio", "CPU busy share of the host", "cpu_util_pct", 0.01),
    ("mtc_node_load1", "1-minute load average", "load1", 1),
    ("mtc_node_memory_available_bytes", "Memory available", "mem_available_mib", 2**20),
    ("mtc_node_network_receive_bytes_total", "Bytes received (all but lo)", "net_rx_bytes", 1),
    ("mtc_node_network_transmit_bytes_total", "Bytes sent (all but lo)", "net_tx_bytes", 1),
)


def _label(value) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _line(name: str, labels: dict, value) -> str:
    inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
    return f"{name}{{{inner}}} {float(value):g}"


def _number(value, scale=1) -> float | None:
    """A finite float from a stored figure, else None (strings, NaN, huge, missing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value) * scale
    except (OverflowError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _dicts(items) -> list[dict]:
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def _report_lines(report, speed_lines: list, gpu_lines: dict, host_lines: dict) -> None:
    base = {"cluster": report.node.cluster.cluster_id, "node": report.node.name}
    for check in _dicts(report.checks):
        details = check.get("details") if isinstance(check.get("details"), dict) else {}
        name = check.get("name")
        if name == "host":
            for metric, _text, key, scale in HOST_GAUGES:
                if (value := _number(details.get(key), scale)) is not None:
                    host_lines[metric].append(_line(metric, base, value))
        if name == "speed" and (value := _number(details.get("gflops"))):
            speed_lines.append(_line("mtc_node_speed_gflops", base, value))
        if name == "gpu":
            for gpu in _dicts(details.get("telemetry")):
                index = gpu.get("index")
                labels = {
                    **base,
                    "gpu": index if isinstance(index, int) else str(index)[:20],
                    "emulated": str(report.node.gpus_emulated).lower(),
                }
                for metric, _text, key, scale in GPU_GAUGES:
                    if (value := _number(gpu.get(key), scale)) is not None:
                        gpu_lines[metric].append(_line(metric, labels, value))


def render() -> str:
    out: list[str] = []

    def family(name: str, kind: str, text: str) -> None:
        out.append(f"# HELP {name} {text}")
        out.append(f"# TYPE {name} {kind}")

    family("mtc_cluster_info", "gauge", "One per cluster, with its state")
    for cid, provider, state in Cluster.objects.values_list("cluster_id", "provider", "state"):
        out.append(
            _line("mtc_cluster_info", {"cluster": cid, "provider": provider, "state": state}, 1)
        )
    family("mtc_nodes", "gauge", "Nodes by Slurm state and health")
    for cid, slurm_state, health, n in (
        Node.objects.values_list("cluster__cluster_id", "slurm_state", "health")
        .annotate(n=Count("id"))
        .order_by()
    ):
        out.append(
            _line("mtc_nodes", {"cluster": cid, "slurm_state": slurm_state, "health": health}, n)
        )
    family("mtc_jobs", "gauge", "Jobs by state (finished ones for MTC_RETENTION_JOBS_DAYS)")
    for cid, state, n in (
        Job.objects.values_list("cluster__cluster_id", "state").annotate(n=Count("id")).order_by()
    ):
        out.append(_line("mtc_jobs", {"cluster": cid, "state": state}, n))
    family("mtc_retention_purged_total", "counter", "Rows the retention purge removed")
    for kind, scope, n in RetentionTally.objects.values_list("kind", "scope", "purged"):
        out.append(_line("mtc_retention_purged_total", {"kind": kind, "cluster": scope}, n))
    family("mtc_node_failures_open", "gauge", "Unresolved failures by mode")
    for cid, mode, n in (
        NodeFailure.objects.exclude(state="RESOLVED")
        .values_list("cluster__cluster_id", "mode")
        .annotate(n=Count("id"))
        .order_by()
    ):
        out.append(_line("mtc_node_failures_open", {"cluster": cid, "mode": mode}, n))
    family("mtc_repairs", "gauge", "Repairs by action and state")
    for cid, action, state, n in (
        Repair.objects.values_list("cluster__cluster_id", "action", "state")
        .annotate(n=Count("id"))
        .order_by()
    ):
        out.append(_line("mtc_repairs", {"cluster": cid, "action": action, "state": state}, n))

    latest = (
        HealthReport.objects.filter(source="agent")
        .values("node_id")
        .annotate(last=Max("id"))
        .values_list("last", flat=True)
    )
    reports = (
        HealthReport.objects.filter(id__in=list(latest))
        .select_related("node__cluster")
        .only("checks", "node__name", "node__gpus_emulated", "node__cluster__cluster_id")
    )
    speed_lines, gpu_lines = [], {name: [] for name, *_ in GPU_GAUGES}
    host_lines = {name: [] for name, *_ in HOST_GAUGES}
    for report in reports:
        try:  # stored data may be odd (old agents, hand edits): skip what cannot be read
            _report_lines(report, speed_lines, gpu_lines, host_lines)
        except Exception:
            log.warning("metrics: report %s skipped", report.pk, exc_info=True)
    family("mtc_node_speed_gflops", "gauge", "The speed check's matrix multiply rate")
    out += speed_lines
    for name, text, _key, _scale in GPU_GAUGES:
        family(name, "gauge", f"{text} (emulated GPUs report zeros)")
        out += gpu_lines[name]
    for name, text, _key, _scale in HOST_GAUGES:
        family(name, "gauge" if "total" not in name else "counter", text)
        out += host_lines[name]
    return "\n".join(out) + "\n"


class MetricsView(APIView):
    """Prometheus scrapes with `authorization: {type: Token, credentials: <key>}`."""

    def get(self, request):
        return HttpResponse(render(), content_type="text/plain; version=0.0.4; charset=utf-8")
