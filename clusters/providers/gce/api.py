"""The vocabulary of the gce plan: where requests go (Target), one request
(ApiRequest), and the spec's pools as the plan sees them. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import access, names

DEFAULT_SUBNET_RANGE = "10.128.0.0/20"


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


# --- pools ------------------------------------------------------------------------
def login_pool(spec: dict) -> dict:
    login = spec["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"]
    return next(p for p in spec["node_pools"] if p["id"] == login)


def compute_pools(spec: dict) -> list[dict]:
    login = spec["orchestrator_spec"]["slurm_spec"]["login_node_pool_id"]
    return [p for p in spec["node_pools"] if p["id"] != login]
