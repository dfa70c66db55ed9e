"""Which replace Compute Engine offers a node: ``instances.reportHostAsFaulty`` (the VM
moves to a healthy host, keeping its name, disks and reservation) where Google supports
it, else delete and insert from the pool's template.

The rule, from https://cloud.google.com/compute/docs/instances/report-host-as-faulty :
reporting a faulty host is supported for A3 Ultra (a3-ultragpu-8g) and A4
(a4-highgpu-8g) VMs that are reservation-bound (provisioningModel RESERVATION_BOUND,
mtc's ``provisioning_model: RESERVATION``). Compute Engine refuses it for others."""

from __future__ import annotations

from .api import ApiRequest

FAULTY_HOST_MACHINE_TYPES = frozenset({"a3-ultragpu-8g", "a4-highgpu-8g"})
FAULTY_HOST_PROVISIONING = "RESERVATION"  # spec value; RESERVATION_BOUND on the VM


def reports_faulty_host(pool: dict) -> bool:
    """Compute Engine moves this pool's VMs off a faulty host on request."""
    return (
        pool["machine_spec"]["machine_type"] in FAULTY_HOST_MACHINE_TYPES
        and pool.get("provisioning_model", "STANDARD") == FAULTY_HOST_PROVISIONING
    )


def faulty_host_request(name: str, why: str = "") -> ApiRequest:
    """Move now (IMMEDIATE): mtc has drained the node and wants it back soon."""
    return ApiRequest(
        "instances",
        "reportHostAsFaulty",
        "zone",
        name,
        {
            "disruptionSchedule": "IMMEDIATE",
            "faultReasons": [
                {
                    "behavior": "BEHAVIOR_UNSPECIFIED",
                    "description": why or "mtc: the node failed its health checks",
                }
            ],
        },
    )
