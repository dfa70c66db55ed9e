"""Compute Engine resource names and URLs for a cluster (pure functions).

Every name starts with the cluster id, so a cluster's resources sort together and
the label ``mtc-cluster=<id>`` ties the labelled ones to it."""

from __future__ import annotations

import hashlib

# IAP's TCP forwarding range: SSH to the login node comes from here.
IAP_RANGE = "35.235.240.0/20"
LABEL_CLUSTER = "mtc-cluster"
LABEL_POOL = "mtc-pool"
MAX_NAME = 63


def resource_name(*parts: str) -> str:
    """``a-b-c``, kept within Compute Engine's 63 characters (a hash keeps it unique)."""
    name = "-".join(parts)
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:6]
    return f"{name[: MAX_NAME - 7].rstrip('-')}-{digest}"


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def controller_name(cluster_id: str) -> str:
    return resource_name(cluster_id, "controller")


def template_name(cluster_id: str, pool_id: str, version: str = "") -> str:
    """``<cluster>-<pool>-<version>``: templates cannot be changed, so a changed spec or
    mtc makes a new one (``version`` a digest of its content); unversioned for clusters
    made before templates were versioned."""
    return (
        resource_name(cluster_id, pool_id, version)
        if version
        else resource_name(cluster_id, pool_id)
    )


def placement_name(cluster_id: str, pool_id: str) -> str:
    return resource_name(cluster_id, pool_id, "compact")


def cluster_tag(cluster_id: str) -> str:
    return resource_name("mtc", cluster_id)


def login_tag(cluster_id: str) -> str:
    return resource_name("mtc", cluster_id, "login")


def firewall_names(cluster_id: str) -> tuple[str, str]:
    return resource_name(cluster_id, "internal"), resource_name(cluster_id, "iap-ssh")


def psa_range_name(cluster_id: str) -> str:
    return resource_name(cluster_id, "psa")


def accelerator_name(accelerator_type: str) -> str:
    """NVIDIA_H200_141GB -> nvidia-h200-141gb, Compute Engine's accelerator type."""
    return accelerator_type.lower().replace("_", "-")


def network_url(project: str, network: str) -> str:
    return f"projects/{project}/global/networks/{network}"


def subnetwork_url(project: str, region: str, subnetwork: str) -> str:
    return f"projects/{project}/regions/{region}/subnetworks/{subnetwork}"


def template_url(project: str, template: str) -> str:
    return f"projects/{project}/global/instanceTemplates/{template}"


def cluster_labels(spec: dict, pool_id: str | None = None) -> dict[str, str]:
    labels = {str(k): str(v) for k, v in (spec.get("labels") or {}).items()}
    labels[LABEL_CLUSTER] = spec["cluster_id"]
    if pool_id:
        labels[LABEL_POOL] = pool_id
    return labels


def network_profile_url(project: str, profile: str) -> str:
    return f"projects/{project}/global/networkProfiles/{profile}"


def controller_address_name(cluster_id: str) -> str:
    return resource_name(cluster_id, "controller", "ip")


def access_firewall_name(cluster_id: str) -> str:
    """The rule that lets mtc's host reach slurmctld."""
    return resource_name(cluster_id, "from-mtc")


def data_firewall_name(network: str) -> str:
    return resource_name(network, "internal")


def peering_name(network: str, peer: str) -> str:
    return resource_name("mtc", network, "to", peer)


def dashboard_id(cluster_id: str) -> str:
    return resource_name("mtc", cluster_id)
