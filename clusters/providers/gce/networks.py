"""A cluster's network requests (VPCs, subnets, peering, the controller's address,
firewall rules), the extra networks a GPU machine type needs, and the NICs its VMs
carry (pure).

nic0 of every node is on the cluster's primary network (mtc's own by default, so mtc
reaches slurmctld); GPU machine types add the data networks Google documents for them:

- A3 Ultra and A4 (RDMA over Converged Ethernet): a second gVNIC VPC, and one VPC with
  the RoCE network profile (``<zone>-vpc-roce``) holding eight subnets, one per MRDMA
  NIC (one per GPU). Compute Engine takes only MRDMA NICs on a RoCE VPC.
- A3 Mega (GPUDirect-TCPXO): eight more gVNIC VPCs, one NIC each, MTU 8244 as Google's
  TCPXO guide sets it.

Ranges are the ones in Google's guides (192.168.N.0/24); each VPC is the cluster's own,
so they do not collide with mtc's network."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import names
from .api import ApiRequest, Target, compute_pools

# What network_requests makes; made only when missing, and deleted only if mtc made it.
NETWORK_RESOURCES = {"networks", "subnetworks", "globalAddresses", "addresses"}
SLURMCTLD_PORT = 6817

# Sources (layouts, subnet ranges, MTUs):
#   https://cloud.google.com/ai-hypercomputer/docs/create/create-vm  (A3 Ultra, A4: RDMA)
#   https://cloud.google.com/compute/docs/gpus/gpu-network-bandwidth#a3-ultra-a4
#   https://cloud.google.com/cluster-toolkit/docs/machine-learning/a3-mega-enable-gpudirect-tcpxo
#   https://cloud.google.com/compute/docs/gpus/gpudirect  (A3 Mega: 8 data VPCs, MTU 8244)
# machine type -> (layout, extra gVNIC VPCs, MRDMA NICs on the RoCE VPC, MTU)
LAYOUTS: dict[str, tuple[str, int, int, int]] = {
    "a3-ultragpu-8g": ("rdma", 1, 8, 8896),
    "a4-highgpu-8g": ("rdma", 1, 8, 8896),
    "a3-megagpu-8g": ("tcpxo", 8, 0, 8244),
}
DATA_RANGE = "192.168.0.0/16"  # every data subnet is in here (internal firewall rules)


@dataclass(frozen=True)
class DataNet:
    """One extra VPC of a cluster and its subnets (one subnet per NIC on it)."""

    network: str
    subnets: tuple[tuple[str, str], ...]  # (name, range)
    mtu: int
    nic_type: str  # GVNIC or MRDMA
    roce: bool = False


def layout_of(machine_type: str) -> tuple[str, int, int, int] | None:
    return LAYOUTS.get(machine_type)


def data_networks(spec: dict, machine_type: str) -> list[DataNet]:
    """The extra VPCs of a machine type, named for the cluster (shared by its pools)."""
    layout = layout_of(machine_type)
    if layout is None:
        return []
    kind, gvnic, mrdma, mtu = layout
    cid = spec["cluster_id"]
    out = []
    for n in range(1, gvnic + 1):
        net = names.resource_name(cid, "gvnic" if kind == "rdma" else "data", str(n))
        out.append(DataNet(net, ((net, f"192.168.{n}.0/24"),), mtu, "GVNIC"))
    if mrdma:
        net = names.resource_name(cid, "roce")
        subnets = tuple(
            (names.resource_name(cid, "roce", str(i)), f"192.168.{gvnic + 1 + i}.0/24")
            for i in range(mrdma)
        )
        out.append(DataNet(net, subnets, mtu, "MRDMA", roce=True))
    return out


def cluster_data_networks(spec: dict, pools: list[dict]) -> list[DataNet]:
    """The extra VPCs of every pool's machine type, each once."""
    seen: dict[str, DataNet] = {}
    for pool in pools:
        for net in data_networks(spec, pool["machine_spec"]["machine_type"]):
            seen.setdefault(net.network, net)
    return list(seen.values())


def network_body(net: DataNet, project: str, zone: str, cluster_id: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": net.network,
        "autoCreateSubnetworks": False,
        "mtu": net.mtu,
        "routingConfig": {"routingMode": "REGIONAL"},
        "description": f"mtc cluster {cluster_id}: GPU data network",
    }
    if net.roce:
        # The zone's RoCE profile: the VPC then takes only MRDMA NICs, in that zone.
        body["networkProfile"] = names.network_profile_url(project, f"{zone}-vpc-roce")
    return body


def subnet_body(net: DataNet, name: str, cidr: str, project: str, region: str) -> dict:
    return {
        "name": name,
        "network": names.network_url(project, net.network),
        "ipCidrRange": cidr,
        "description": f"mtc: {net.nic_type} NICs",
    }


def nics(spec: dict, machine_type: str, project: str, region: str) -> list[dict[str, Any]]:
    """The NICs after nic0 of one VM of this machine type (no external address)."""
    out = []
    for net in data_networks(spec, machine_type):
        for subnet, _ in net.subnets:
            out.append(
                {
                    "network": names.network_url(project, net.network),
                    "subnetwork": names.subnetwork_url(project, region, subnet),
                    "nicType": net.nic_type,
                }
            )
    return out


# --- requests -------------------------------------------------------------------
def needs_private_services(spec: dict) -> bool:
    """mtc makes a Filestore or Lustre instance: it needs an allocated range and the
    service-networking connection on the cluster's network."""
    storage = spec.get("storage") or {}
    home = storage.get("home") or {}
    if home and home.get("type", "filestore") == "filestore":
        if not home.get("ip") and not home.get("instance"):
            return True
    return any(not i.get("ip") and not i.get("instance") for i in storage.get("lustre") or [])


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
    own = network == target.network
    requests = []
    if not own:  # mtc's own network is never made (nor deleted) by a cluster
        requests.append(
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
            )
        )
    if not own or subnet != (target.subnetwork or target.network):
        requests.append(
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
            )
        )
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
    for data in cluster_data_networks(spec, compute_pools(spec)):
        requests.append(
            ApiRequest(
                "networks",
                "insert",
                "global",
                data.network,
                network_body(data, target.project, target.zone, cid),
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
                    subnet_body(data, name, cidr, target.project, target.region),
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
    if psa is None and needs_private_services(spec):
        psa = {}  # mtc makes Filestore or Lustre: they need a range (default /20)
    if psa is not None:
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
    """What mtc's host reaches on the controller. On gce mtc submits with sbatch and
    reads with scontrol/sinfo (SlurmClient without a slurmrestd socket), all through
    slurmctld: its port is the only one. A slurmrestd would add its port here."""
    return [str(SLURMCTLD_PORT)]


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
    for data in cluster_data_networks(spec, compute_pools(spec)):
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
                    "sourceRanges": [DATA_RANGE],
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


def network_interfaces(spec: dict, pool: dict, target: Target, *, role: str) -> list[dict]:
    """nic0 on the primary network, then the machine type's data NICs (workers only)."""
    network, subnet = primary_network(spec, target)
    out = [
        {
            "network": names.network_url(target.project, network),
            "subnetwork": names.subnetwork_url(target.project, target.region, subnet),
            "nicType": "GVNIC",
        }
    ]
    if role != "controller":
        machine_type = pool["machine_spec"]["machine_type"]
        out += nics(spec, machine_type, target.project, target.region)
    return out
