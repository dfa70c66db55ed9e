"""The Compute Engine requests that create a cluster, built from its spec (pure).

`mtc cluster plan` and the wizard's review step print these; the provider sends the
very same bodies, so what a user reviews is what Compute Engine receives. Bodies are
the REST API's JSON (camelCase), paths are relative to ``/compute/v1/``.
The network requests are built in networks.py, the request type in api.py."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from identity.sources.base import AccountData

from . import access, dashboard, names
from .api import DEFAULT_SUBNET_RANGE, ApiRequest, Target, compute_pools, login_pool
from .bootstrap import CGROUP_CONF, gres_conf, hook_script, slurm_conf, startup_script
from .networks import (
    NETWORK_RESOURCES,
    firewall_requests,
    network_interfaces,
    network_requests,
    primary_network,
)

REDACTED_KEY = "<munge key: generated at create, not shown>"
CONTROLLER_IP_PLACEHOLDER = "<reserved at create>"


def placement_requests(spec: dict, target: Target) -> list[ApiRequest]:
    """A compact placement policy per GPU pool: its nodes land close on the network."""
    out = []
    for pool in compute_pools(spec):
        if not needs_placement_policy(pool):
            continue
        name = names.placement_name(spec["cluster_id"], pool["id"])
        out.append(
            ApiRequest(
                "resourcePolicies",
                "insert",
                "region",
                name,
                {
                    "name": name,
                    "groupPlacementPolicy": {"collocation": "COLLOCATED"},
                    "description": f"mtc: compact placement for pool {pool['id']}",
                },
                when="if missing",
            )
        )
    return out


def needs_placement_policy(pool: dict) -> bool:
    """GPU pools get a compact placement policy of mtc's, except from a reservation: its
    VMs are already placed densely by the reservation, and Compute Engine refuses a
    second placement policy on reservation-bound VMs."""
    return bool(pool["machine_spec"].get("accelerator_count")) and (
        pool.get("provisioning_model", "STANDARD") != "RESERVATION"
    )


def _scheduling(pool: dict, gpus: bool) -> dict[str, Any]:
    model = pool.get("provisioning_model", "STANDARD")
    scheduling: dict[str, Any] = {
        # GPUs cannot live-migrate: a host maintenance event stops the VM.
        "onHostMaintenance": "TERMINATE" if gpus else "MIGRATE",
        "automaticRestart": model not in ("SPOT", "FLEX_START"),
        # A reservation's VMs are bound to it (A3 Ultra, A4 and calendar-mode capacity):
        # they end with the reservation, so they say what happens then.
        "provisioningModel": "RESERVATION_BOUND" if model == "RESERVATION" else model,
    }
    if model in ("SPOT", "FLEX_START", "RESERVATION"):
        scheduling["instanceTerminationAction"] = "DELETE"
    if model == "FLEX_START":
        scheduling["maxRunDuration"] = {"seconds": str(7 * 24 * 3600)}
    return scheduling


def _reservation_affinity(pool: dict) -> dict[str, Any] | None:
    affinity = pool["machine_spec"].get("reservation_affinity")
    model = pool.get("provisioning_model", "STANDARD")
    if affinity:
        out: dict[str, Any] = {"consumeReservationType": affinity["reservation_affinity_type"]}
        if affinity["reservation_affinity_type"] == "SPECIFIC_RESERVATION":
            out["key"] = affinity["key"]
            out["values"] = list(affinity["values"])
        return out
    if model == "RESERVATION":
        return {"consumeReservationType": "ANY_RESERVATION"}
    if model in ("SPOT", "FLEX_START"):
        return {"consumeReservationType": "NO_RESERVATION"}
    return None


def template_request(
    spec: dict,
    pool: dict,
    target: Target,
    *,
    role: str,
    munge_key: str,
    accounts: Sequence[AccountData] = (),
    controller_ip: str = "",
) -> ApiRequest:
    """One instance template per pool (the login pool's makes the controller)."""
    cluster_id = spec["cluster_id"]
    machine = pool["machine_spec"]
    gpus = machine.get("accelerator_count") or 0
    disk = pool.get("boot_disk") or {}
    tags = [names.cluster_tag(cluster_id)]
    if role == "controller":
        tags.append(names.login_tag(cluster_id))
    slurm = spec["orchestrator_spec"]["slurm_spec"]
    metadata = [
        {"key": "startup-script", "value": startup_script(spec, role=role, pool=pool)},
        {"key": "enable-guest-attributes", "value": "TRUE"},
        {"key": "enable-oslogin", "value": "TRUE"},
        {"key": "mtc-cluster", "value": cluster_id},
        {"key": "mtc-role", "value": role},
        {"key": "mtc-munge-key", "value": munge_key},  # only root can fetch it (block.sh)
        {"key": access.ACCOUNTS_KEY, "value": access.accounts_json(accounts)},
    ]
    if role == "controller":
        metadata += [
            {
                "key": "mtc-slurm-conf",
                "value": slurm_conf(spec, controller_ip=controller_ip or CONTROLLER_IP_PLACEHOLDER),
            },
            {"key": "mtc-gres-conf", "value": gres_conf(spec)},
            {"key": "mtc-cgroup-conf", "value": CGROUP_CONF},
        ]
    else:
        metadata += [
            {"key": "mtc-prolog", "value": hook_script(slurm["prolog_bash_scripts"], "prolog")},
            {"key": "mtc-epilog", "value": hook_script(slurm["epilog_bash_scripts"], "epilog")},
        ]
    properties: dict[str, Any] = {
        "machineType": machine["machine_type"],
        "disks": [
            {
                "boot": True,
                "autoDelete": True,
                "type": "PERSISTENT",
                "initializeParams": {
                    "sourceImage": target.image,
                    "diskType": disk.get("boot_disk_type", "pd-balanced"),
                    "diskSizeGb": str(disk.get("boot_disk_size_gb", 100)),
                    "labels": names.cluster_labels(spec, pool["id"]),
                },
            }
        ],
        "networkInterfaces": network_interfaces(spec, pool, target, role=role),
        "scheduling": _scheduling(pool, bool(gpus)),
        "labels": names.cluster_labels(spec, pool["id"]),
        "tags": {"items": tags},
        "metadata": {"items": metadata},
        # A dedicated account with only the scopes nodes need: a job that got a token
        # anyway could not touch the project.
        "serviceAccounts": [
            {"email": target.node_service_account, "scopes": access.node_scopes(spec)}
        ],
    }
    if gpus:
        properties["guestAccelerators"] = [
            {
                "acceleratorType": names.accelerator_name(machine["accelerator_type"]),
                "acceleratorCount": gpus,
            }
        ]
        if role != "controller" and needs_placement_policy(pool):
            properties["resourcePolicies"] = [names.placement_name(cluster_id, pool["id"])]
    affinity = _reservation_affinity(pool)
    if affinity:
        properties["reservationAffinity"] = affinity
    name = names.template_name(cluster_id, pool["id"], template_version(properties))
    return ApiRequest(
        "instanceTemplates",
        "insert",
        "global",
        name,
        {
            "name": name,
            "description": f"mtc cluster {cluster_id}, pool {pool['id']}",
            "properties": properties,
        },
        when="if missing",
    )


def template_version(properties: dict) -> str:
    """A digest of a template's content, the munge key left out (the same for the
    cluster's life, and shown redacted in a plan): the same spec, accounts and mtc give
    the same name, any change a new one."""
    content = copy.deepcopy(properties)
    for item in content.get("metadata", {}).get("items", []):
        if item["key"] == "mtc-munge-key":
            item["value"] = ""
    digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
    return digest[:8]


def controller_request(
    spec: dict, target: Target, controller_ip: str = "", *, template: str
) -> ApiRequest:
    """The controller from its template, nic0 on the address reserved for it: the
    address slurm.conf names (SlurmctldHost=<name>(<ip>)), so mtc needs no DNS."""
    cluster_id = spec["cluster_id"]
    login = login_pool(spec)
    name = names.controller_name(cluster_id)
    nics = network_interfaces(spec, login, target, role="controller")
    nics[0]["networkIP"] = controller_ip or CONTROLLER_IP_PLACEHOLDER
    return ApiRequest(
        "instances",
        "insert",
        "zone",
        name,
        {"name": name, "networkInterfaces": nics},
        query={"sourceInstanceTemplate": names.template_url(target.project, template)},
        when="if missing",
    )


def bulk_insert_request(
    spec: dict, pool: dict, target: Target, nodes: list[str], *, template: str
) -> ApiRequest:
    """Workers of one pool in one call, all or nothing (a training job needs them all),
    from the pool's template (its name)."""
    return ApiRequest(
        "instances",
        "bulkInsert",
        "zone",
        pool["id"],
        {
            "count": str(len(nodes)),
            "minCount": str(len(nodes)),
            "perInstanceProperties": {node: {} for node in nodes},
            "sourceInstanceTemplate": names.template_url(target.project, template),
        },
        when="for the missing nodes",
    )


def node_names(spec: dict, pool: dict, count: int | None = None) -> list[str]:
    count = pool["scaling_spec"]["min_node_count"] if count is None else count
    return [f"{spec['cluster_id']}-{pool['id']}-{i}" for i in range(count)]


def munge_key_value(key: bytes | None) -> str:
    return base64.b64encode(key).decode() if key else REDACTED_KEY


def cluster_plan(
    spec: dict,
    target: Target,
    *,
    munge_key: bytes | None = None,
    accounts: Sequence[AccountData] = (),
    controller_ip: str = "",
) -> list[ApiRequest]:
    """Every request ``create`` sends, in order; ``accounts`` are the POSIX accounts
    every node gets (access.node_accounts() at create); ``controller_ip`` is the address
    the network step reserved (a placeholder in a plan shown before create)."""
    key = munge_key_value(munge_key)
    requests = network_requests(spec, target) + firewall_requests(spec, target)
    requests += placement_requests(spec, target)
    login = template_request(
        spec,
        login_pool(spec),
        target,
        role="controller",
        munge_key=key,
        accounts=accounts,
        controller_ip=controller_ip,
    )
    workers = {
        pool["id"]: template_request(
            spec, pool, target, role="worker", munge_key=key, accounts=accounts
        )
        for pool in compute_pools(spec)
    }
    requests += [login, *workers.values()]
    requests.append(controller_request(spec, target, controller_ip, template=login.name))
    for pool in compute_pools(spec):
        requests.append(
            bulk_insert_request(
                spec, pool, target, node_names(spec, pool), template=workers[pool["id"]].name
            )
        )
    requests.append(dashboard_request(spec, target))
    return requests


def dashboard_request(spec: dict, target: Target) -> ApiRequest:
    """The cluster's Cloud Monitoring dashboard (REST v1, monitoring.googleapis.com)."""
    body = dashboard.dashboard_body(spec, target.project)
    return ApiRequest(
        "dashboards",
        "insert",
        "monitoring",
        names.dashboard_id(spec["cluster_id"]),
        body,
        when="if missing",
    )


def split_files(body: dict) -> tuple[dict, dict[str, str]]:
    """Multi-line metadata values (scripts, slurm.conf) taken out of a request body, so
    people read them as files instead of one long JSON string."""
    body = json.loads(json.dumps(body))
    files: dict[str, str] = {}
    for item in body.get("properties", {}).get("metadata", {}).get("items", []):
        if "\n" in item.get("value", ""):
            files[item["key"]] = item["value"]
            item["value"] = f"<{item['key']}: printed below>"
    return body, files


__all__ = [
    "DEFAULT_SUBNET_RANGE",
    "NETWORK_RESOURCES",
    "ApiRequest",
    "Target",
    "cluster_plan",
    "firewall_requests",
    "network_requests",
    "primary_network",
]
