"""The gce provider: a Slurm cluster on Compute Engine (docs/spec.md, docs/gce.md).

The controller (also the login node) and the workers are instances made from one
instance template per pool; workers come in one ``bulkInsert`` per pool and join
Slurm as dynamic nodes. Every step looks before it creates, so a retry after a crash
or a stockout makes nothing twice. mtc's own Slurm commands reach the controller
over the VPC with the cluster's munge key (a local munged): clusters go on mtc's VPC
or are peered with it, and slurm.conf names the controller by its reserved address.
Past 400 lines: create, readiness, delete and repairs of one provider read together."""

from __future__ import annotations

import logging
import shutil
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from slurm import SlurmClient, SlurmError

from .. import munge
from ..base import Provider, ProviderError
from . import access, dashboard, image, names, plan, repairs, storage
from .bootstrap import slurm_conf
from .client import ComputeApi

if TYPE_CHECKING:
    from clusters.models import Cluster, Node

log = logging.getLogger(__name__)
RUNNING = "RUNNING"
GONE_STATES = {"TERMINATED", "STOPPED", "SUSPENDED", "STOPPING", "SUSPENDING"}
# Slurm base states of a node that has not joined (or has left) the cluster.
SLURM_NOT_READY = {"DOWN", "FUTURE", "UNKNOWN"}


def target_for(spec: dict, project: str = "") -> plan.Target:
    """Where a cluster's requests go. A cluster keeps the project it was made in."""
    project = project or settings.MTC_GCE_PROJECT
    if not project:
        raise ProviderError(
            "The gce provider needs a project: set MTC_GCE_PROJECT (README, 'Running on "
            "Compute Engine').",
            code="GCE_NOT_CONFIGURED",
            permanent=True,
        )
    return plan.Target(
        project=project,
        zone=spec["zone"],
        image=settings.MTC_GCE_IMAGE.replace("{project}", project),
        subnet_range=settings.MTC_GCE_SUBNET_RANGE,
        service_account=settings.MTC_GCE_SERVICE_ACCOUNT,
        network=settings.MTC_GCE_NETWORK,
        subnetwork=settings.MTC_GCE_SUBNETWORK,
        control_address=control_address(),
    )


def control_address() -> str:
    """mtc's host as the cluster sees it: the setting, else the source address of the
    default route (a UDP connect sends nothing)."""
    if settings.MTC_GCE_CONTROL_ADDRESS:
        return settings.MTC_GCE_CONTROL_ADDRESS
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("10.255.255.255", 1))
            return sock.getsockname()[0]
    except OSError:
        return "127.0.0.1"


class GceProvider(Provider):
    name = "gce"
    gpus_emulated = False

    @property
    def ready_timeout_s(self) -> float:  # a VM boots and runs its startup script
        return settings.MTC_GCE_READY_TIMEOUT_S

    @property
    def repair_ready_timeout_s(self) -> float:
        return settings.MTC_GCE_READY_TIMEOUT_S

    # --- where things are ---------------------------------------------------------
    def root(self, cluster: Cluster) -> Path:
        return Path(settings.DATA_DIR) / "clusters" / cluster.cluster_id

    def conf_path(self, cluster: Cluster) -> Path:
        return self.root(cluster) / "etc" / "slurm.conf"

    def api(self, cluster: Cluster) -> ComputeApi:
        return ComputeApi(
            target_for(cluster.spec, (cluster.provider_state or {}).get("project", ""))
        )

    def _remember(self, cluster: Cluster, **values) -> None:
        """Keep what delete must know later (the project, networks mtc created)."""
        from clusters.models import Cluster as ClusterModel

        cluster.provider_state = {**(cluster.provider_state or {}), **values}
        ClusterModel.objects.filter(pk=cluster.pk).update(provider_state=cluster.provider_state)

    def slurm(self, cluster: Cluster) -> SlurmClient:
        return SlurmClient(self.conf_path(cluster))

    def node_python(self) -> str:  # the image's venv (deploy/image/provision.sh)
        return image.NODE_PYTHON

    def node_root(self) -> str:
        return image.NODE_ROOT

    def login_command(self, cluster: Cluster) -> str:
        target = self.api(cluster).target
        return (
            f"gcloud compute ssh {names.controller_name(cluster.cluster_id)} "
            f"--zone {target.zone} --project {target.project} --tunnel-through-iap"
        )

    # --- create and resize ------------------------------------------------------------
    def _ensure_client_side(self, cluster: Cluster) -> bytes:
        """The munge key, a local munged with it, and the client copy of slurm.conf."""
        root = self.root(cluster)
        (root / "etc").mkdir(parents=True, exist_ok=True)
        key = munge.key(root)
        munge.ensure(root)
        text = slurm_conf(
            cluster.spec,
            munge_socket=munge.socket_path(root),
            controller_ip=(cluster.provider_state or {}).get("controller_ip", ""),
        )
        path = self.conf_path(cluster)
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)
        return key

    def _created(self, cluster: Cluster) -> dict[str, list[str]]:
        """What mtc made of the network pieces, by resource (a name each, in order)."""
        created = (cluster.provider_state or {}).get("created", {})
        return {k: [v] if isinstance(v, str) else list(v) for k, v in created.items()}

    def _ensure_network_piece(self, cluster: Cluster, api: ComputeApi, request) -> None:
        """Network pieces mtc creates are recorded, so delete removes those and only those."""
        if request.verb == "addPeering":
            peering = request.body["networkPeering"]["name"]
            network = api.get("networks", request.name)
            if network is None or any(p.name == peering for p in network.peerings):
                return
            key, value = "peerings", f"{request.name}/{peering}"
        else:
            if api.exists(request.resource, request.name):
                return
            key, value = request.resource, request.name
        created = self._created(cluster)
        if value not in created.get(key, []):
            created[key] = [*created.get(key, []), value]
            self._remember(cluster, created=created)  # before the insert: a crash keeps it
        api.send(replace(request, when=""))  # looked already

    def _controller_ip(self, cluster: Cluster, api: ComputeApi) -> str:
        """The internal address reserved for slurmctld (SlurmctldHost=<name>(<ip>))."""
        address = api.get("addresses", names.controller_address_name(cluster.cluster_id))
        ip = address.address if address else ""
        if not ip:
            raise ProviderError("the controller's address was not reserved", code="GCE_ERROR")
        if cluster.provider_state.get("controller_ip") != ip:
            self._remember(cluster, controller_ip=ip)
        return ip

    def apply(self, cluster: Cluster, nodes: list[Node]) -> None:
        """Send the plan's requests in its order: what `mtc cluster plan` shows is what
        is sent; each bulkInsert is cut down to the pool's nodes that do not exist yet.
        The network step comes first: it reserves the controller's address, which the
        controller's slurm.conf and mtc's own copy name."""
        api = self.api(cluster)
        if not cluster.provider_state.get("project"):
            self._remember(cluster, project=api.target.project)
        spec, target = cluster.spec, api.target
        if not api.exists("networks", target.network):
            raise ProviderError(
                f"mtc's own network '{target.network}' is not in project {target.project}: "
                "set MTC_GCE_NETWORK to the VPC mtc runs in (README, 'Running on Compute "
                "Engine').",
                code="GCE_NOT_CONFIGURED",
                permanent=True,
            )
        for request in plan.network_requests(spec, target):
            self._ensure_network_piece(cluster, api, request)
        controller_ip = self._controller_ip(cluster, api)
        spec = self._ensure_storage(cluster, target)  # the mounts need the real addresses
        key = self._ensure_client_side(cluster)
        pools = {p["id"]: p for p in spec["node_pools"]}
        existing = api.instances(cluster.cluster_id)
        accounts = access.node_accounts()
        requests = plan.cluster_plan(
            spec, target, munge_key=key, accounts=accounts, controller_ip=controller_ip
        )
        for request in requests:
            if request.resource in plan.NETWORK_RESOURCES:
                continue  # sent above
            if request.resource == "dashboards":
                if cluster.provider_state.get("dashboard") != request.name:  # made once
                    dashboard.DashboardsApi(target.project).create(request.body)
                    self._remember(cluster, dashboard=request.name)
            elif request.verb == "bulkInsert":
                missing = [
                    n.name
                    for n in nodes
                    if n.pool.pool_id == request.name and n.name not in existing
                ]
                template = request.body["sourceInstanceTemplate"].rsplit("/", 1)[1]
                if missing:
                    api.send(
                        plan.bulk_insert_request(
                            spec, pools[request.name], target, missing, template=template
                        ),
                        timeout=settings.MTC_GCE_OPERATION_TIMEOUT_S * 3,
                    )
            elif request.resource == "instanceTemplates":
                self._ensure_template(cluster, api, request)
            else:
                api.send(request)
        self._record_instance_ids(cluster, api, nodes)
        self._delete_old_templates(cluster, api)

    def _ensure_template(self, cluster: Cluster, api: ComputeApi, request) -> None:
        """The pool's template of this spec and mtc, recorded (before the insert, so a
        crash still deletes it) and made the pool's current one: repairs recreate nodes
        from it."""
        pool_id = request.body["properties"]["labels"][names.LABEL_POOL]
        created = self._created(cluster)
        if request.name not in created.get("instanceTemplates", []):
            created["instanceTemplates"] = [*created.get("instanceTemplates", []), request.name]
            self._remember(cluster, created=created)
        api.send(request)
        templates = dict((cluster.provider_state or {}).get("templates", {}))
        if templates.get(pool_id) != request.name:
            templates[pool_id] = request.name
            self._remember(cluster, templates=templates)

    def _delete_old_templates(self, cluster: Cluster, api: ComputeApi) -> None:
        """Templates a changed spec or mtc replaced: instances made from them do not
        need them any more (Compute Engine copies a template into each instance)."""
        current = set((cluster.provider_state or {}).get("templates", {}).values())
        created = self._created(cluster)
        old = [n for n in created.get("instanceTemplates", []) if n not in current]
        if not old:
            return
        api.send_all([plan.ApiRequest("instanceTemplates", "delete", "global", n) for n in old])
        created["instanceTemplates"] = [n for n in created["instanceTemplates"] if n in current]
        self._remember(cluster, created=created)

    def _template(self, cluster: Cluster, pool_id: str) -> str:
        """The pool's current template; unversioned for a cluster made before versions."""
        templates = (cluster.provider_state or {}).get("templates", {})
        return templates.get(pool_id) or names.template_name(cluster.cluster_id, pool_id)

    def _ensure_storage(self, cluster: Cluster, target: plan.Target) -> dict:
        """Filestore and Lustre made (recorded first, so delete finds them) or checked;
        the spec with each one's address, as read back, for the startup scripts."""
        spec = cluster.spec

        def record(kind: str, name: str) -> None:
            made = dict((cluster.provider_state or {}).get("storage", {}))
            if kind == "connection":
                made[kind] = made.get(kind) or name  # made, or extended with our range
            elif name not in made.get(kind, []):
                made[kind] = [*made.get(kind, []), name]
            self._remember(cluster, storage=made)

        if storage.needs_private_services(spec):
            storage.ensure_connection(spec, target, lambda how: record("connection", how))
        return storage.with_ips(spec, storage.ensure(spec, target, record))

    def dashboard_url(self, cluster: Cluster) -> str:
        """The cluster's Cloud Monitoring dashboard in the console ("" before create)."""
        state = cluster.provider_state or {}
        if not state.get("dashboard") or not state.get("project"):
            return ""
        return dashboard.console_url(state["project"], cluster.cluster_id)

    def _record_instance_ids(self, cluster: Cluster, api: ComputeApi, nodes: list[Node]) -> None:
        """Each node's provider id names its VM: gce://project/zone/name#instance-id."""
        from clusters.models import Node as NodeModel

        instances = api.instances(cluster.cluster_id)
        changed = []
        for node in nodes:
            inst = instances.get(node.name)
            if inst is None:
                continue
            provider_id = f"gce://{api.target.project}/{api.target.zone}/{node.name}#{inst.id}"
            if node.provider_id != provider_id:
                node.provider_id = provider_id
                changed.append(node)
        NodeModel.objects.bulk_update(changed, ["provider_id"])

    def wait_ready(self, cluster: Cluster, names_: list[str], *, timeout: float) -> None:
        """Every named node RUNNING, its startup script reported ``slurmd=ready``, and
        the controller answering and reporting the node registered and responding."""
        api = self.api(cluster)
        deadline = time.monotonic() + timeout
        while True:
            waiting, failed = self._not_ready(cluster, api, names_)
            if failed:
                raise ProviderError(
                    "startup script failed on " + "; ".join(failed), code="NODE_SETUP_FAILED"
                )
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"{len(waiting)} node(s) not ready yet: {', '.join(waiting[:10])}",
                    code="TIMEOUT",
                )
            time.sleep(settings.MTC_GCE_POLL_S)

    def _not_ready(
        self, cluster: Cluster, api: ComputeApi, wanted: list[str]
    ) -> tuple[list[str], list[str]]:
        instances = api.instances(cluster.cluster_id)
        controller = names.controller_name(cluster.cluster_id)
        waiting, failed = [], []
        for name in [controller, *wanted]:
            inst = instances.get(name)
            if inst is None or inst.status != RUNNING:
                waiting.append(name)
                continue
            attrs = api.guest_attributes(name)
            state = attrs.get("state", "")
            if state.startswith("failed"):
                failed.append(f"{name} ({state})")
            elif (
                state != "ready"
                or attrs.get("slurmctld" if name == controller else "slurmd") != "ready"
            ):
                waiting.append(name)
        if waiting or failed:
            return waiting, failed
        # Guest attributes only say what a startup script wrote; what counts is what the
        # controller says, asked from mtc's side with the cluster's munge key.
        return [n for n in [controller, *wanted] if n not in self._slurm_ready(cluster)], []

    def _slurm_ready(self, cluster: Cluster) -> set[str]:
        """The controller, if it answers, and the nodes it has registered and hears from."""
        slurm = self.slurm(cluster)
        if not slurm.ping():
            return set()
        try:
            nodes = slurm.nodes()
        except SlurmError as exc:
            log.info("sinfo on %s: %s", cluster.cluster_id, exc)
            return set()
        ready = {
            n.name
            for n in nodes
            if n.state not in SLURM_NOT_READY and "NOT_RESPONDING" not in n.flags
        }
        return ready | {names.controller_name(cluster.cluster_id)}

    def dead_nodes(self, cluster: Cluster, nodes: list[Node]) -> list[Node]:
        """Nodes whose instance is gone or stopped (e.g. a Spot VM that was preempted)."""
        instances = self.api(cluster).instances(cluster.cluster_id)
        return [
            n for n in nodes if n.name not in instances or instances[n.name].status in GONE_STATES
        ]

    def controller_alive(self, cluster: Cluster) -> bool:
        api = self.api(cluster)
        controller = names.controller_name(cluster.cluster_id)
        inst = api.instances(cluster.cluster_id).get(controller)
        return bool(inst and inst.status == RUNNING and api.guest_attributes(controller))

    # --- remove ------------------------------------------------------------------------
    def _delete_instances(self, api: ComputeApi, instance_names: list[str]) -> None:
        api.send_all([plan.ApiRequest("instances", "delete", "zone", n) for n in instance_names])

    def delete_nodes(self, cluster: Cluster, nodes: list[Node]) -> None:
        self._delete_instances(self.api(cluster), [n.name for n in nodes])
        try:  # dynamic nodes stay known to slurmctld until deleted there
            self.slurm(cluster).node_delete([n.name for n in nodes])
        except SlurmError as exc:
            log.info("scontrol delete node on %s: %s", cluster.cluster_id, exc)

    def delete_cluster(self, cluster: Cluster) -> None:
        """Instances first, then what they used; networks only if mtc made them."""
        root = self.root(cluster)
        if not (cluster.provider_state or {}).get("project"):  # never reached Compute Engine
            munge.stop(root)
            shutil.rmtree(root, ignore_errors=True)
            return
        api = self.api(cluster)
        spec, target, state = cluster.spec, api.target, cluster.provider_state or {}
        self._delete_instances(api, sorted(api.instances(cluster.cluster_id)))
        templates = self._created(cluster).get("instanceTemplates", [])
        if "templates" not in state:  # made before templates were versioned
            templates = [
                names.template_name(cluster.cluster_id, p["id"]) for p in spec["node_pools"]
            ]
        deletions = [plan.ApiRequest("instanceTemplates", "delete", "global", n) for n in templates]
        deletions += [
            plan.ApiRequest("resourcePolicies", "delete", "region", r.name)
            for r in plan.placement_requests(spec, target)
        ]
        deletions += [
            plan.ApiRequest("firewalls", "delete", "global", r.name)
            for r in plan.firewall_requests(spec, target)
        ]
        # Storage before the range and network it uses; only what mtc made.
        storage.delete(spec, target, state.get("storage", {}))
        created = self._created(cluster)
        for peering in created.get("peerings", []):
            network, name = peering.split("/", 1)
            deletions.append(
                plan.ApiRequest("networks", "removePeering", "global", network, {"name": name})
            )
        for resource, scope in (
            ("addresses", "region"),
            ("globalAddresses", "global"),
            ("subnetworks", "region"),
            ("networks", "global"),
        ):
            deletions += [
                plan.ApiRequest(resource, "delete", scope, name)
                for name in reversed(created.get(resource, []))
            ]
        for request in deletions:
            try:
                api.send(request)
            except ProviderError as exc:
                if request.verb != "removePeering":
                    raise
                # A peering whose network or peer is gone already: nothing to remove.
                log.info("removePeering %s: %s", request.name, exc)
        if state.get("dashboard"):
            dashboard.DashboardsApi(target.project).delete(state["dashboard"])
        munge.stop(root)
        shutil.rmtree(root, ignore_errors=True)

    # --- repairs -----------------------------------------------------------------------
    def _recreate(self, cluster: Cluster, node: Node) -> str:
        api = self.api(cluster)
        api.send(plan.ApiRequest("instances", "delete", "zone", node.name))
        template = self._template(cluster, node.pool.pool_id)
        api.send(
            plan.ApiRequest(
                "instances",
                "insert",
                "zone",
                node.name,
                {"name": node.name},
                query={"sourceInstanceTemplate": names.template_url(api.target.project, template)},
            )
        )
        inst = api.instances(cluster.cluster_id).get(node.name)
        return f"gce://{api.target.project}/{api.target.zone}/{node.name}#{inst.id if inst else ''}"

    def reboot_node(self, cluster: Cluster, node: Node) -> None:
        """instances.reset, then the node's new boot seen: its guest attributes outlive
        the reset, so until the startup script reports another boot id, the old boot's
        ``slurmd=ready`` would make the node look back at once."""
        api = self.api(cluster)
        before = api.guest_attributes(node.name).get("boot", "")
        api.send(plan.ApiRequest("instances", "reset", "zone", node.name))
        self._await_new_boot(api, node, before, "instances.reset")

    def _await_new_boot(self, api: ComputeApi, node: Node, before: str, after: str) -> None:
        deadline = time.monotonic() + self.repair_ready_timeout_s
        while api.guest_attributes(node.name).get("boot", before) in (before, ""):
            if time.monotonic() > deadline:
                raise ProviderError(f"{node.name} did not boot again after {after}", code="TIMEOUT")
            time.sleep(settings.MTC_GCE_POLL_S)

    def reimage_node(self, cluster: Cluster, node: Node) -> None:
        """A fresh boot disk from the pool's template (the instance is recreated)."""
        self._recreate(cluster, node)

    def replace_node(self, cluster: Cluster, node: Node) -> str:
        """reportHostAsFaulty where Google supports it (repairs.py: the VM moves to a
        healthy host, keeping its reservation), else a new VM under the same name. Then
        the new boot is awaited as after a reset; the health agent's checks run at boot
        before slurmd starts, as on local."""
        pool = next(p for p in cluster.spec["node_pools"] if p["id"] == node.pool.pool_id)
        if not repairs.reports_faulty_host(pool):
            return self._recreate(cluster, node)
        api = self.api(cluster)
        before = api.guest_attributes(node.name).get("boot", "")
        api.send(repairs.faulty_host_request(node.name))
        self._await_new_boot(api, node, before, "reportHostAsFaulty")
        inst = api.instances(cluster.cluster_id).get(node.name)
        return f"gce://{api.target.project}/{api.target.zone}/{node.name}#{inst.id if inst else ''}"


def plan_describe(spec: dict) -> dict:
    """The requests ``create`` would send for a validated gce spec, for people to read.
    Works without a configured project (it shows a placeholder)."""
    target = target_for(spec, settings.MTC_GCE_PROJECT or "PROJECT_ID")
    accounts = access.node_accounts()
    spec, storage_steps = storage.planned(spec, target)
    return {
        "project": target.project,
        "zone": target.zone,
        "region": target.region,
        "node_access": {
            "service_account": target.node_service_account,
            "scopes": access.node_scopes(spec),
            "metadata_server": (
                f"only root reaches {access.METADATA_ADDRESS} and {access.METADATA_HOST} "
                "(tcp 80): the startup script's first step"
            ),
            "accounts": [
                {"name": a.name, "uid": a.uid, "gid": a.gid, "home": a.home} for a in accounts
            ],
        },
        "requests": [
            r.describe(target) for r in plan.cluster_plan(spec, target, accounts=accounts)
        ],
        # Filestore, Lustre and their peering: sent after the network step (storage.py).
        "storage": storage_steps,
    }
