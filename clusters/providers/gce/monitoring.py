"""Cloud Monitoring for gce clusters (google-cloud-monitoring), behind one small class.

Reads the GPU metrics that the Ops Agent's DCGM integration publishes for a node's
instance, in the shape of the node page's GPU charts, and writes mtc's own figures
(job throughput, node health, goodput) as custom metrics. The library has only a
gRPC transport: ``MTC_GCE_MONITORING_ENDPOINT`` (host:port) with anonymous
credentials points it at a plain-text local server (tests); otherwise it talks to
Google with Application Default Credentials."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from google.api_core import exceptions as gexc
from google.cloud import monitoring_v3

from ..base import ProviderError

log = logging.getLogger(__name__)
Aligner = monitoring_v3.Aggregation.Aligner

# The node page's GPU chart metric -> (Cloud Monitoring metric type, aligner, scale).
# DCGM receiver v2 of the Ops Agent; power is the rate of the energy counter (J/s = W).
GPU_METRICS: dict[str, tuple[str, int, float]] = {
    "utilization_pct": ("workload.googleapis.com/gpu.dcgm.utilization", Aligner.ALIGN_MEAN, 100.0),
    "memory_used_mib": (
        "workload.googleapis.com/gpu.dcgm.memory.bytes_used",
        Aligner.ALIGN_MEAN,
        1 / 2**20,
    ),
    "temperature_c": ("workload.googleapis.com/gpu.dcgm.temperature", Aligner.ALIGN_MEAN, 1.0),
    "power_w": ("workload.googleapis.com/gpu.dcgm.energy_consumption", Aligner.ALIGN_RATE, 1.0),
}
# memory.bytes_used has a series per state (used, free, reserved): the chart is "used".
GPU_METRIC_FILTERS: dict[str, str] = {"memory_used_mib": 'metric.labels.state = "used"'}
CUSTOM_PREFIX = "custom.googleapis.com/mtc/"
WRITE_BATCH = 200  # Cloud Monitoring takes at most 200 series per create call


@dataclass
class Sample:
    """One value of one of mtc's own metrics, now."""

    metric: str  # e.g. "job/tokens_per_second" (under custom.googleapis.com/mtc/)
    value: float
    labels: dict[str, str] = field(default_factory=dict)


def _client() -> monitoring_v3.MetricServiceClient:
    endpoint = settings.MTC_GCE_MONITORING_ENDPOINT
    if endpoint and settings.MTC_GCE_ANONYMOUS:
        import grpc
        from google.cloud.monitoring_v3.services.metric_service.transports.grpc import (
            MetricServiceGrpcTransport,
        )

        transport = MetricServiceGrpcTransport(channel=grpc.insecure_channel(endpoint))
        return monitoring_v3.MetricServiceClient(transport=transport)
    options = {"api_endpoint": endpoint} if endpoint else None
    return monitoring_v3.MetricServiceClient(client_options=options)


class CloudMonitoring:
    def __init__(self, project: str) -> None:
        self.project = project
        self.client = _client()

    def _list(
        self,
        metric_type: str,
        instance: str,
        aligner: int,
        since: datetime,
        until: datetime,
        step_s: int,
        extra: str = "",
    ):
        request = monitoring_v3.ListTimeSeriesRequest(
            name=f"projects/{self.project}",
            filter=(
                f'metric.type = "{metric_type}" AND resource.type = "gce_instance" '
                f'AND metadata.system_labels.name = "{instance}"'
                + (f" AND {extra}" if extra else "")
            ),
            interval=monitoring_v3.TimeInterval(start_time=since, end_time=until),
            aggregation=monitoring_v3.Aggregation(
                alignment_period=timedelta(seconds=step_s), per_series_aligner=aligner
            ),
            view=monitoring_v3.ListTimeSeriesRequest.TimeSeriesView.FULL,
        )
        try:
            # A page waits on this: one try, a few seconds, then say so on the page.
            return list(self.client.list_time_series(request=request, retry=None, timeout=5))
        except gexc.GoogleAPIError as exc:
            raise ProviderError(f"Cloud Monitoring: {exc}", code="MONITORING_ERROR") from exc

    def gpu_series(
        self, instance: str, *, since: datetime, until: datetime, step_s: int = 60
    ) -> list[dict]:
        """Per GPU: {"index", "time": [iso...], "temperature_c": [...], ...}, oldest first,
        one point per ``step_s`` (one list call per metric, whatever the GPU count)."""
        by_gpu: dict[int, dict[str, dict[str, float]]] = {}
        for name, (metric_type, aligner, scale) in GPU_METRICS.items():
            extra = GPU_METRIC_FILTERS.get(name, "")
            for series in self._list(metric_type, instance, aligner, since, until, step_s, extra):
                label = series.metric.labels.get("gpu_number", "0")
                index = int(label) if label.isdigit() else 0
                for point in series.points:
                    stamp = point.interval.end_time.isoformat()
                    value = point.value.double_value or float(point.value.int64_value)
                    by_gpu.setdefault(index, {}).setdefault(stamp, {})[name] = value * scale
        out = []
        for index in sorted(by_gpu):
            stamps = sorted(by_gpu[index])
            row: dict = {"index": index, "time": stamps}
            for name in GPU_METRICS:
                row[name] = [by_gpu[index][s].get(name) for s in stamps]
            out.append(row)
        return out

    def write(self, samples: list[Sample], *, now: datetime) -> int:
        """mtc's own figures as custom metrics (gauges on the global resource)."""
        series = [
            monitoring_v3.TimeSeries(
                metric={"type": CUSTOM_PREFIX + s.metric, "labels": s.labels},
                resource={"type": "global", "labels": {"project_id": self.project}},
                points=[
                    monitoring_v3.Point(
                        interval=monitoring_v3.TimeInterval(end_time=now),
                        value=monitoring_v3.TypedValue(double_value=float(s.value)),
                    )
                ],
            )
            for s in samples
        ]
        for start in range(0, len(series), WRITE_BATCH):
            try:
                self.client.create_time_series(
                    name=f"projects/{self.project}",
                    time_series=series[start : start + WRITE_BATCH],
                    timeout=10,
                )
            except gexc.GoogleAPIError as exc:
                raise ProviderError(f"Cloud Monitoring: {exc}", code="MONITORING_ERROR") from exc
        return len(series)
