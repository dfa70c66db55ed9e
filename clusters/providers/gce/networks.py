"""The extra networks a GPU machine type needs, and the NICs its VMs carry (pure).

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
