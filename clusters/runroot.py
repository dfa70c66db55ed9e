"""A cluster's run root: where its jobs write output, work and run directories,
checkpoints, metrics and replica files. mtc reads and writes the same paths (job
output, run configs, the metrics poll), so the run root is at the same path on mtc's
host and on every node.

- ``storage.run_root`` in the spec names it (local: any absolute path on this host;
  gce: a path on the cluster's Filestore /home or a Lustre mount, which mtc's host
  mounts too: docs/gce.md);
- else, local clusters use their own folder, ``$MTC_DATA_DIR/clusters/<id>``;
- else, a gce cluster with a Filestore /home uses ``/home/.mtc``;
- else a gce cluster has none, and what would write there answers 400 naming
  ``storage``.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from mtc.fielderrors import FieldErrors

from .models import Cluster

GCE_HOME_RUN_ROOT = "/home/.mtc"  # hidden: no POSIX name starts with a dot


class NoRunRoot(FieldErrors):
    """The cluster has nowhere shared to run jobs from (HTTP 400 naming ``storage``)."""


def cluster_dir(cluster_id: str) -> Path:
    """The cluster's own folder in mtc's data dir (its Slurm config and daemons' state)."""
    return Path(settings.DATA_DIR) / "clusters" / cluster_id


def run_root_of(spec: dict, cluster_id: str, provider: str) -> Path | None:
    storage = spec.get("storage") or {}
    if storage.get("run_root"):
        return Path(storage["run_root"])
    if provider == "local":
        return cluster_dir(cluster_id)
    if storage.get("home"):
        return Path(GCE_HOME_RUN_ROOT)
    return None


def run_root(cluster: Cluster) -> Path:
    """The cluster's run root; raises NoRunRoot when it has none."""
    root = run_root_of(cluster.spec, cluster.cluster_id, cluster.provider)
    if root is None:
        raise NoRunRoot(
            {
                "storage": (
                    f"Cluster '{cluster.cluster_id}' has no shared run root for job output "
                    "and runs: give it a Filestore storage.home, or storage.run_root on a "
                    "Lustre mount, mounted at the same path on mtc's host."
                )
            }
        )
    return root


def run_root_or_none(cluster: Cluster) -> Path | None:
    return run_root_of(cluster.spec, cluster.cluster_id, cluster.provider)


def is_own_dir(cluster: Cluster, root: Path) -> bool:
    """Whether ``root`` is the cluster's folder in mtc's data dir (mtc made its parents)."""
    return root == cluster_dir(cluster.cluster_id)
