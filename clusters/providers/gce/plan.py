"""The Compute Engine requests that create a cluster, built from its spec (pure).

`mtc cluster plan` and the wizard's review step print these; the provider sends the
very same bodies, so what a user reviews is what Compute Engine receives. Bodies are
the REST API's JSON (camelCase), paths are relative to ``/compute/v1/``.
Past 400 lines on purpose: every request body of a create, in the order they are sent."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from identity.sources.base import AccountData

from . import access, dashboard, names, networks
from .bootstrap import CGROUP_CONF, gres_conf, hook_script, slurm_conf, startup_script

REDACTED_KEY = "<munge key: generated at create, not shown>"
DEFAULT_SUBNET_RANGE = "10.128.0.0/20"
# What network_requests makes; made only when missing, and deleted only if mtc made it.
NETWORK_RESOURCES = {"networks", "subnetworks", "globalAddresses", "addresses"}
SLURMCTLD_PORT = 6817
CONTROLLER_IP_PLACEHOLDER = "<reserved at create>"


@dataclass(frozen=True)
class Target:
    """Where requests go: the project and zone, the boot image, the subnet range."""

    project: str
    zone: str
    image: str
    subnet_range: str = DEFAULT_SUBNET_RANGE
    service_account: str = ""  # the nodes' own; may hold {project}
    # mtc's own network: a cluster is on it unless its spec names another (then peered).
    network: str = "default"
    subnetwork: str = ""  # mtc's subnetwork in the region ("" = named like the network)
    control_address: str = ""  # mtc's host as the cluster sees it (firewall source)

    @property
    def region(self) -> str:
        return names.region_of(self.zone)

    @property
    def node_service_account(self) -> str:
        return access.service_account(self.service_account, self.project)


@dataclass
class ApiRequest:
    """One Compute Engine call: ``resource.verb`` on ``name`` in a scope."""

    resource: str  # networks, subnetworks, firewalls, globalAddresses, resourcePolicies, ...
    verb: str  # insert, bulkInsert, delete, reset
    scope: str  # global, region or zone
    name: str
    body: dict[str, Any] | None = None
    query: dict[str, str] = field(default_factory=dict)
    when: str = ""  # e.g. "if missing": ensure-steps look before they create

    def path(self, target: Target) -> str:
        base = f"projects/{target.project}"
        if self.scope == "monitoring":  # Cloud Monitoring's REST API (v1 dashboards)
            return f"{base}/{self.resource}" + (f"/{self.name}" if self.verb == "delete" else "")
        if self.scope == "global":
            base += "/global"
        elif self.scope == "region":
            base += f"/regions/{target.region}"
        elif self.scope == "zone":
            base += f"/zones/{target.zone}"
        # The API calls global addresses "addresses" under /global (method globalAddresses).
        collection = "addresses" if self.resource == "globalAddresses" else self.resource
        path = f"{base}/{collection}"
        if self.verb == "bulkInsert":
            path += "/bulkInsert"
        elif self.verb == "delete":
            path += f"/{self.name}"
        elif self.verb != "insert":
            path += f"/{self.name}/{self.verb}"
        if self.query:
            path += "?" + "&".join(f"{k}={v}" for k, v in self.query.items())
        return path

    @property
    def api(self) -> str:
        return "v1" if self.scope == "monitoring" else "compute/v1"

    @property
    def http_method(self) -> str:
        return "DELETE" if self.verb == "delete" else "POST"

    def describe(self, target: Target) -> dict[str, Any]:
        out: dict[str, Any] = {
            "method": f"{'monitoring' if self.scope == 'monitoring' else 'compute'}"
            f".{self.resource}.{self.verb}",
            "http": f"{self.http_method} /{self.api}/{self.path(target)}",
            "name": self.name,
        }
        if self.when:
            out["when"] = self.when
        if self.body is not None:
            out["body"] = self.body
        return out


# --- network --------------------------------------------------------------------
def primary_network(spec: dict, target: Target) -> tuple[str, str]:
    """nic0's network and subnetwork: mtc's own unless the spec names another."""
    net = spec.get("network") or {}
    network = net.get("network") or target.network
    if network == target.network:
        subnet = net.get("subnetwork") or target.subnetwork or network
    else:
        subnet = net.get("subnetwork") or network
    return network, subnet


def network_requests(spec: dict, target: Target) -> list[ApiRequest]:
    """The VPCs, subnets, peering, the controller's address and the private-services
    range: created only when missing."""
    net = spec.get("network") or {}
    network, subnet = primary_network(spec, target)
    cid = spec["cluster_id"]
    requests = [
        ApiRequest(
            "networks",
            "insert",
            "global",
            network,
            {
                "name": network,
                "autoCreateSubnetworks": False,
                "mtu": net.get("mtu", 1460),
                "routingConfig": {"routingMode": "REGIONAL"},
                "description": f"mtc cluster {cid}",
            },
            when="if missing",
        ),
        ApiRequest(
            "subnetworks",
            "insert",
            "region",
            subnet,
            {
                "name": subnet,
                "network": names.network_url(target.project, network),
                "ipCidrRange": target.subnet_range,
                "privateIpGoogleAccess": True,
                "description": f"mtc cluster {cid}",
            },
            when="if missing",
        ),
    ]
    if network != target.network:
        # A network of the spec's own: peered with mtc's both ways, so mtc reaches
        # slurmctld (a peering is active only once both sides have one).
        for here, there in ((network, target.network), (target.network, network)):
            requests.append(
                ApiRequest(
                    "networks",
                    "addPeering",
                    "global",
                    here,
                    {
                        "networkPeering": {
                            "name": names.peering_name(here, there),
                            "network": names.network_url(target.project, there),
                            "exchangeSubnetRoutes": True,
                        }
                    },
                    when="if missing",
                )
            )
    for data in networks.cluster_data_networks(spec, compute_pools(spec)):
        requests.append(
            ApiRequest(
                "networks",
                "insert",
                "global",
                data.network,
                networks.network_body(data, target.project, target.zone, cid),
                when="if missing",
            )
        )
        for name, cidr in data.subnets:
            requests.append(
                ApiRequest(
                    "subnetworks",
                    "insert",
                    "region",
                    name,
                    networks.subnet_body(data, name, cidr, target.project, target.region),
                    when="if missing",
                )
            )
    address = names.controller_address_name(cid)
    requests.append(
        ApiRequest(
            "addresses",
            "insert",
            "region",
            address,
            {
                "name": address,
                "addressType": "INTERNAL",
                "purpose": "GCE_ENDPOINT",
                "subnetwork": names.subnetwork_url(target.project, target.region, subnet),
                "description": f"mtc cluster {cid}: slurmctld (SlurmctldHost)",
            },
            when="if missing",
        )
    )
    psa = net.get("private_service_access")
    if psa:
        name = names.psa_range_name(cid)
        requests.append(
            ApiRequest(
                "globalAddresses",
                "insert",
                "global",
                name,
                {
                    "name": name,
                    "purpose": "VPC_PEERING",
                    "addressType": "INTERNAL",
                    "prefixLength": psa.get("range_prefix_length", 20),
                    "network": names.network_url(target.project, network),
                    "description": "Private services access (Filestore, Managed Lustre)",
                },
                when="if missing",
            )
        )
    return requests


def slurm_ports(spec: dict) -> list[str]:
    """What mtc's host reaches on the controller: slurmctld, and slurmrestd if used."""
    slurm = spec["orchestrator_spec"]["slurm_spec"]
    ports = [str(SLURMCTLD_PORT)]
    if slurm.get("rest_port"):
        ports.append(str(slurm["rest_port"]))
    return ports


def firewall_requests(spec: dict, target: Target) -> list[ApiRequest]:
    cluster_id = spec["cluster_id"]
    network = names.network_url(target.project, primary_network(spec, target)[0])
    internal, iap = names.firewall_names(cluster_id)
    tag = names.cluster_tag(cluster_id)
    requests = [
        ApiRequest(
            "firewalls",
            "insert",
            "global",
            internal,
            {
                "name": internal,
                "network": network,
                "direction": "INGRESS",
                "priority": 1000,
                "sourceTags": [tag],
                "sourceRanges": [target.subnet_range],
                "targetTags": [tag],
                "allowed": [{"IPProtocol": "tcp"}, {"IPProtocol": "udp"}, {"IPProtocol": "icmp"}],
                "description": "mtc: all traffic between the cluster's nodes",
            },
            when="if missing",
        ),
        ApiRequest(
            "firewalls",
            "insert",
            "global",
            iap,
            {
                "name": iap,
                "network": network,
                "direction": "INGRESS",
                "priority": 1000,
                "sourceRanges": [names.IAP_RANGE],
                "targetTags": [names.login_tag(cluster_id)],
                "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
                "description": "mtc: SSH to the login node through Identity-Aware Proxy",
            },
            when="if missing",
        ),
    ]
    access_rule = names.access_firewall_name(cluster_id)
    requests.append(
        ApiRequest(
            "firewalls",
            "insert",
            "global",
            access_rule,
            {
                "name": access_rule,
                "network": network,
                "direction": "INGRESS",
                "priority": 1000,
                "sourceRanges": [_cidr(target.control_address or "MTC_ADDRESS")],
                "targetTags": [names.login_tag(cluster_id)],
                "allowed": [{"IPProtocol": "tcp", "ports": slurm_ports(spec)}],
                "description": "mtc: its own host to slurmctld (scontrol, sbatch, sinfo)",
            },
            when="if missing",
        )
    )
    for data in networks.cluster_data_networks(spec, compute_pools(spec)):
        if data.roce:
            continue  # a RoCE VPC carries only RDMA traffic and takes no firewall rules
        name = names.data_firewall_name(data.network)
        requests.append(
            ApiRequest(
                "firewalls",
                "insert",
                "global",
                name,
                {
                    "name": name,
                    "network": names.network_url(target.project, data.network),
                    "direction": "INGRESS",
                    "priority": 1000,
                    "sourceRanges": [networks.DATA_RANGE],
                    "allowed": [
                        {"IPProtocol": "tcp"},
                        {"IPProtocol": "udp"},
                        {"IPProtocol": "icmp"},
                    ],
                    "description": "mtc: GPU data traffic between the cluster's nodes",
                },
                when="if missing",
            )
        )
    return requests


def _cidr(address: str) -> str:
    return address if "/" in address else f"{address}/32"


# --- pools ------------------------------------------------------------------------
def _login_pool(spec: dict) -> dict:
    login = spec["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"]
    return next(p for p in spec["node_pools"] if p["id"] == login)


def compute_pools(spec: dict) -> list[dict]:
    login = spec["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"]
    return [p for p in spec["node_pools"] if p["id"] != login]


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
    name = names.template_name(cluster_id, pool["id"])
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


def network_interfaces(spec: dict, pool: dict, target: Target, *, role: str) -> list[dict]:
    """nic0 on the primary network, then the machine type's data NICs (workers only)."""
    network, subnet = primary_network(spec, target)
    nics = [
        {
            "network": names.network_url(target.project, network),
            "subnetwork": names.subnetwork_url(target.project, target.region, subnet),
            "nicType": "GVNIC",
        }
    ]
    if role != "controller":
        machine_type = pool["machine_spec"]["machine_type"]
        nics += networks.nics(spec, machine_type, target.project, target.region)
    return nics


def controller_request(spec: dict, target: Target, controller_ip: str = "") -> ApiRequest:
    """The controller from its template, nic0 on the address reserved for it: the
    address slurm.conf names (SlurmctldHost=<name>(<ip>)), so mtc needs no DNS."""
    cluster_id = spec["cluster_id"]
    login = _login_pool(spec)
    template = names.template_name(cluster_id, login["id"])
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


def bulk_insert_request(spec: dict, pool: dict, target: Target, nodes: list[str]) -> ApiRequest:
    """Workers of one pool in one call, all or nothing (a training job needs them all)."""
    template = names.template_name(spec["cluster_id"], pool["id"])
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
    requests.append(
        template_request(
            spec,
            _login_pool(spec),
            target,
            role="controller",
            munge_key=key,
            accounts=accounts,
            controller_ip=controller_ip,
        )
    )
    for pool in compute_pools(spec):
        requests.append(
            template_request(spec, pool, target, role="worker", munge_key=key, accounts=accounts)
        )
    requests.append(controller_request(spec, target, controller_ip))
    for pool in compute_pools(spec):
        requests.append(bulk_insert_request(spec, pool, target, node_names(spec, pool)))
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
