"""mtc's own figures for a gce cluster, written to Cloud Monitoring as custom metrics
(job throughput, node health, goodput), so they sit next to the VMs' own metrics."""

from __future__ import annotations

import logging

from django.db.models import Count
from django.utils import timezone

from clusters.models import Cluster
from clusters.providers.gce.monitoring import CloudMonitoring, Sample
from jobs.models import Job

from .selectors import goodput

log = logging.getLogger(__name__)
JOB_STATES = ("PENDING", "RUNNING")


def cluster_samples(cluster: Cluster) -> list[Sample]:
    """What to write for one cluster now (four queries, whatever its size)."""
    samples = []
    running = Job.objects.filter(cluster=cluster, state="RUNNING").exclude(recipe="")
    for job in running.only("job_id", "recipe", "metrics"):
        tokens = (job.metrics or {}).get("tokens_per_s")
        if isinstance(tokens, (int, float)):
            labels = {"cluster": cluster.cluster_id, "job_id": job.job_id, "recipe": job.recipe}
            samples.append(Sample("job/tokens_per_second", tokens, labels))
    for name, health in cluster.nodes.values_list("name", "health"):
        samples.append(
            Sample(
                "node/healthy",
                1.0 if health == "HEALTHY" else 0.0,
                {"cluster": cluster.cluster_id, "node": name, "health": health},
            )
        )
    # Job counts by state, for the cluster's dashboard (a zero keeps a state's line).
    counts = dict(
        Job.objects.filter(cluster=cluster, state__in=JOB_STATES)
        .values_list("state")
        .annotate(n=Count("id"))
    )
    for state in JOB_STATES:
        samples.append(
            Sample(
                "cluster/jobs",
                float(counts.get(state, 0)),
                {"cluster": cluster.cluster_id, "state": state},
            )
        )
    goodput = _goodput(cluster)
    if goodput is not None:
        samples.append(Sample("cluster/goodput", goodput, {"cluster": cluster.cluster_id}))
    return samples


def _goodput(cluster: Cluster) -> float | None:
    figures = goodput(cluster_id=cluster.cluster_id)
    value = figures.get("goodput") if isinstance(figures, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def cloud_metrics_export(*, cluster: Cluster) -> int:
    """Write the cluster's samples; returns how many series were written."""
    project = (cluster.provider_state or {}).get("project")
    if not project:
        return 0
    samples = cluster_samples(cluster)
    return CloudMonitoring(project).write(samples, now=timezone.now()) if samples else 0
