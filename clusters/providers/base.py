"""What every provider does; services call only these methods."""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from django.conf import settings

if TYPE_CHECKING:
    from clusters.models import Cluster, Node
    from slurm import SlurmClient, SlurmNode


class ProviderError(Exception):
    """A provider step failed. ``permanent`` errors are not retried."""

    def __init__(self, message: str, *, code: str = "PROVIDER_ERROR", permanent: bool = False):
        super().__init__(message)
        self.code = code
        self.permanent = permanent


class Provider(ABC):
    name: str
    gpus_emulated: bool = False
    # Local daemons need a port each; cloud machines have their own addresses.
    uses_ports: bool = False
    # How long a create or resize waits for new nodes to join Slurm, and a repair for
    # its node to come back.
    ready_timeout_s: float = 60
    repair_ready_timeout_s: float = 30

    @abstractmethod
    def apply(self, cluster: Cluster, nodes: list[Node]) -> None:
        """Bring controller and ``nodes`` up, matching the cluster's rows. Idempotent."""

    @abstractmethod
    def wait_ready(self, cluster: Cluster, names: list[str], *, timeout: float) -> None:
        """Return when every named node has registered with Slurm; raise on timeout."""

    @abstractmethod
    def delete_nodes(self, cluster: Cluster, nodes: list[Node]) -> None:
        """Stop and remove these nodes (already drained). Idempotent."""

    @abstractmethod
    def delete_cluster(self, cluster: Cluster) -> None:
        """Stop every daemon or instance of the cluster and remove what it made."""

    @abstractmethod
    def controller_alive(self, cluster: Cluster) -> bool: ...

    @abstractmethod
    def slurm(self, cluster: Cluster) -> SlurmClient:
        """The Slurm adapter pointed at this cluster."""

    def describe(self, cluster: Cluster) -> list[SlurmNode]:
        """Slurm's view of the nodes, from one sinfo call."""
        return self.slurm(cluster).nodes()

    def dead_nodes(self, cluster: Cluster, nodes: list[Node]) -> list[Node]:
        """Nodes whose daemon or machine is gone (only providers that can tell)."""
        return []

    def drain_nodes(self, cluster: Cluster, names: list[str], reason: str) -> None:
        if names:
            self.slurm(cluster).node_update(names, state="DRAIN", reason=reason)

    def nodes_drained(self, cluster: Cluster, names: list[str]) -> bool:
        """True once none of the named nodes runs a job any more."""
        seen = {n.name: n for n in self.slurm(cluster).nodes()}
        return all(name not in seen or seen[name].state in ("IDLE", "DOWN") for name in names)

    @abstractmethod
    def reboot_node(self, cluster: Cluster, node: Node) -> None: ...

    @abstractmethod
    def reimage_node(self, cluster: Cluster, node: Node) -> None: ...

    @abstractmethod
    def replace_node(self, cluster: Cluster, node: Node) -> str:
        """Put a new machine in the node's place (same name and partition); return its
        provider id."""

    def login_command(self, cluster: Cluster) -> str:
        return ""

    # Where the node runtime is on the cluster's nodes, for batch scripts that run it.
    # By default the nodes are this host (the local provider): mtc's own python, whose
    # environment has torch, and this checkout's node/ package.
    def node_python(self) -> str:
        """The python a batch script runs node/ with on this provider's nodes."""
        return sys.executable

    def node_root(self) -> str:
        """The directory holding node/ on this provider's nodes (its PYTHONPATH)."""
        return str(settings.BASE_DIR)

    def dashboard_url(self, cluster: Cluster) -> str:
        """A page of the cluster's metrics outside mtc ("" when there is none)."""
        return ""

    def nodes_ready(self, cluster: Cluster, nodes: list[Node]) -> None:  # noqa: B027
        """Optional hook: every node of ``nodes`` registered (start what should wait for that)."""

    def services_check(self, cluster: Cluster) -> None:  # noqa: B027 - optional hook
        """Bring back a helper daemon that died while the controller runs (every 10 s)."""

    def node_checks(
        self,
        cluster: Cluster,
        node: Node,
        *,
        dcgm_level: int | None = None,
        trigger: str = "on-demand",
    ) -> dict | None:
        """Run the node's health checks now (DCGM at ``dcgm_level``) and return the agent's
        report, where the provider can reach the node directly; None where the node's own
        agent reports."""
        return None
