"""A Cloud Monitoring dashboard per gce cluster: made with the cluster, linked from its
page, deleted with it.

google-cloud-monitoring-dashboards is not among mtc's dependencies, so the dashboard
is the REST API's JSON (monitoring.googleapis.com/v1, projects.dashboards) sent with an
authorized requests session: the same body the plan shows. GPU charts use the Ops
Agent's DCGM receiver v2 metrics (workload.googleapis.com/gpu.dcgm.*), one line per
node; node states and job counts are mtc's own custom metrics (health/cloud_metrics)."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from google.api_core import exceptions as gexc

from ..base import ProviderError
from . import names

log = logging.getLogger(__name__)
DCGM = "workload.googleapis.com/gpu.dcgm."
CUSTOM = "custom.googleapis.com/mtc/"
CONSOLE = "https://console.cloud.google.com/monitoring/dashboards/builder"
BY_NODE = ["metadata.system_labels.name"]

# (title, metric filter, aligner, reducer, group by, y-axis label)
CHARTS: tuple[tuple[str, str, str, str, list[str], str], ...] = (
    (
        "GPU utilization by node",
        f'metric.type="{DCGM}utilization"',
        "ALIGN_MEAN",
        "REDUCE_MEAN",
        BY_NODE,
        "ratio",
    ),
    (
        "GPU temperature by node",
        f'metric.type="{DCGM}temperature"',
        "ALIGN_MEAN",
        "REDUCE_MAX",
        BY_NODE,
        "°C",
    ),
    # The energy counter's rate is power (J/s = W), summed over a node's GPUs.
    (
        "GPU power by node",
        f'metric.type="{DCGM}energy_consumption"',
        "ALIGN_RATE",
        "REDUCE_SUM",
        BY_NODE,
        "W",
    ),
    # memory.bytes_used has one series per state (used, free, reserved): only "used".
    (
        "GPU memory used by node",
        f'metric.type="{DCGM}memory.bytes_used" AND metric.labels.state="used"',
        "ALIGN_MEAN",
        "REDUCE_SUM",
        BY_NODE,
        "bytes",
    ),
)
MTC_CHARTS: tuple[tuple[str, str, str, str, list[str], str], ...] = (
    (
        "Nodes by health",
        f'metric.type="{CUSTOM}node/healthy"',
        "ALIGN_NEXT_OLDER",
        "REDUCE_COUNT",
        ["metric.labels.health"],
        "nodes",
    ),
    (
        "Jobs by state",
        f'metric.type="{CUSTOM}cluster/jobs"',
        "ALIGN_NEXT_OLDER",
        "REDUCE_SUM",
        ["metric.labels.state"],
        "jobs",
    ),
)


def _tile(i: int, chart: tuple, scope: str) -> dict[str, Any]:
    title, metric, aligner, reducer, group_by, unit = chart
    return {
        "xPos": (i % 2) * 24,
        "yPos": (i // 2) * 16,
        "width": 24,
        "height": 16,
        "widget": {
            "title": title,
            "xyChart": {
                "dataSets": [
                    {
                        "timeSeriesQuery": {
                            "timeSeriesFilter": {
                                "filter": f"{metric} AND {scope}",
                                "aggregation": {
                                    "alignmentPeriod": "60s",
                                    "perSeriesAligner": aligner,
                                    "crossSeriesReducer": reducer,
                                    "groupByFields": group_by,
                                },
                            }
                        },
                        "plotType": "LINE",
                    }
                ],
                "yAxis": {"label": unit, "scale": "LINEAR"},
            },
        },
    }


def dashboard_body(spec: dict, project: str) -> dict[str, Any]:
    """The Dashboard resource (REST JSON) for one cluster."""
    cid = spec["cluster_id"]
    nodes = f'resource.type="gce_instance" AND metadata.user_labels."{names.LABEL_CLUSTER}"="{cid}"'
    mtc = f'resource.type="global" AND metric.labels.cluster="{cid}"'
    tiles = [_tile(i, c, nodes) for i, c in enumerate(CHARTS)]
    tiles += [_tile(len(CHARTS) + i, c, mtc) for i, c in enumerate(MTC_CHARTS)]
    return {
        "name": f"projects/{project}/dashboards/{names.dashboard_id(cid)}",
        "displayName": f"mtc cluster {cid}",
        "mosaicLayout": {"columns": 48, "tiles": tiles},
        "labels": {"mtc": ""},
    }


def console_url(project: str, cluster_id: str) -> str:
    return f"{CONSOLE}/{names.dashboard_id(cluster_id)}?project={project}"


class DashboardsApi:
    """projects.dashboards create/delete over REST (v1)."""

    def __init__(self, project: str) -> None:
        self.project = project
        self.base = (
            f"{settings.MTC_GCE_DASHBOARD_ENDPOINT.rstrip('/')}/v1/projects/{project}/dashboards"
        )
        if settings.MTC_GCE_ANONYMOUS:
            import requests

            self.session = requests.Session()
        else:
            import google.auth
            from google.auth.transport.requests import AuthorizedSession

            creds, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/monitoring"])
            self.session = AuthorizedSession(creds)

    def _check(self, response, where: str, ok: tuple[int, ...] = ()) -> None:
        if response.status_code < 400 or response.status_code in ok:
            return
        error = gexc.from_http_response(response)
        raise ProviderError(f"Cloud Monitoring {where}: {error.message}", code="MONITORING_ERROR")

    def create(self, body: dict) -> None:
        """Create, or keep the one there (409: made by an earlier try)."""
        try:
            response = self.session.post(self.base, json=body, timeout=30)
        except OSError as exc:
            raise ProviderError(f"Cloud Monitoring: {exc}", code="GCE_UNAVAILABLE") from exc
        self._check(response, "dashboards.create", ok=(409,))

    def delete(self, dashboard_id: str) -> None:
        try:
            response = self.session.delete(f"{self.base}/{dashboard_id}", timeout=30)
        except OSError as exc:
            raise ProviderError(f"Cloud Monitoring: {exc}", code="GCE_UNAVAILABLE") from exc
        self._check(response, "dashboards.delete", ok=(404,))
