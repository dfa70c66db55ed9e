"""A local stand-in for the Compute Engine REST API that records every request.

The real google-cloud-compute clients (REST transport, anonymous credentials) are
pointed here. It keeps resources in memory, answers inserts and deletes with
Operations that go PENDING -> RUNNING -> DONE as they are polled, reports guest
attributes the way a node's startup script would, and fails on demand (a stockout
on bulkInsert, a 503 once). It holds reservations as Compute Engine does: a VM that
names one must fit it (machine type, room left), a reservation-bound VM must name one,
and such a VM takes no placement policy of its own. A network made with the RoCE
network profile takes only MRDMA NICs (and an MRDMA NIC only such a network), internal
addresses get an IP, networks take peerings, and Cloud Monitoring's dashboards
(``/v1/projects/<p>/dashboards``) are kept too."""

from __future__ import annotations

import itertools
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

DASHBOARDS = re.compile(r"^/v1/projects/(?P<project>[^/]+)/dashboards(?:/(?P<name>[^/]+))?$")
# Storage APIs, each under its own prefix (tests point each endpoint setting there).
STORAGE = re.compile(
    r"^/(?P<api>file|lustre)/v1/projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)"
    r"/instances(?:/(?P<name>[^/]+))?$"
)
STORAGE_OPS = re.compile(r"^/(?P<api>file|lustre|servicenetworking)/v1/(?P<op>.*operations/.+)$")
CONNECTIONS = "/servicenetworking/v1/services/servicenetworking.googleapis.com/connections"
# reportHostAsFaulty: A3 Ultra and A4, reservation-bound (as Compute Engine documents).
FAULTY_HOST_TYPES = {"a3-ultragpu-8g", "a4-highgpu-8g"}
SCOPED = re.compile(
    r"^/compute/v1/projects/(?P<project>[^/]+)"
    r"(?:/(?P<scope>global|regions/[^/]+|zones/[^/]+))?/(?P<rest>.*)$"
)


@dataclass
class Recorded:
    method: str
    path: str
    query: dict
    body: dict | None

    @property
    def call(self) -> str:
        """e.g. 'POST instances/bulkInsert' or 'DELETE instances/n-1' (no project/scope)."""
        match = SCOPED.match(self.path)
        return f"{self.method} {match['rest'] if match else self.path}"


@dataclass
class FakeCompute:
    requests: list[Recorded] = field(default_factory=list)
    resources: dict[tuple[str, str], dict] = field(default_factory=dict)  # (kind, name)
    operations: dict[str, dict] = field(default_factory=dict)
    stockout: bool = False  # bulkInsert ends with ZONE_RESOURCE_POOL_EXHAUSTED
    fail_once: list[tuple[str, str, int]] = field(default_factory=list)  # method, path, status
    never_ready: set[str] = field(default_factory=set)  # instances whose script hangs
    # name -> {"machineType", "count", "inUseCount", "specificReservationRequired"}
    reservations: dict[str, dict] = field(default_factory=dict)
    dashboards: dict[str, dict] = field(default_factory=dict)  # dashboard id -> body
    # After instances.reset: how many guest-attribute reads still see the old boot (its
    # attributes outlive the reset), then how many see the new boot still configuring.
    reset_old_reads: int = 3
    reset_configuring_reads: int = 2
    booting: dict[str, list[int]] = field(default_factory=dict)  # name -> [old, configuring]
    # Filestore and Lustre instances by (api, name); service-networking connections by
    # network; storage operations by name (done on the second read).
    storage: dict[tuple[str, str], dict] = field(default_factory=dict)
    connections: dict[str, dict] = field(default_factory=dict)
    storage_ops: dict[str, dict] = field(default_factory=dict)
    # What an image builder VM's script reports (mtc/image): "done" or "failed: why".
    image_build_result: str = "done"
    # The most instance deletes whose operations were unfinished at once.
    peak_open_deletes: int = 0
    ids: itertools.count = field(default_factory=lambda: itertools.count(1000))
    lock: threading.Lock = field(default_factory=threading.Lock)

    # --- what tests look at --------------------------------------------------
    def calls(self, method: str | None = None) -> list[str]:
        return [
            r.call
            for r in self.requests
            if (method is None or r.method == method) and "/operations/" not in r.path
        ]

    def writes(self) -> list[Recorded]:
        return [r for r in self.requests if r.method in ("POST", "DELETE", "PUT", "PATCH")]

    def names(self, kind: str) -> list[str]:
        return sorted(name for k, name in self.resources if k == kind)

    def clear_log(self) -> None:
        self.requests.clear()

    # --- behaviour -------------------------------------------------------------
    def _operation(
        self,
        kind: str,
        name: str,
        verb: str,
        scope: str,
        *,
        error: dict | None = None,
        on_done=None,
    ) -> dict:
        op_name = f"operation-{next(self.ids)}"
        op = {
            "kind": "compute#operation",
            "id": str(next(self.ids)),
            "name": op_name,
            "operationType": verb,
            "targetLink": f"{scope}/{kind}/{name}",
            "status": "PENDING",
            "progress": 0,
        }
        self.operations[op_name] = {"op": op, "error": error, "on_done": on_done}
        if (kind, verb) == ("instances", "delete"):
            open_deletes = sum(
                1
                for e in self.operations.values()
                if e["op"]["status"] != "DONE"
                and e["op"]["operationType"] == "delete"
                and "/instances/" in e["op"]["targetLink"]
            )
            self.peak_open_deletes = max(self.peak_open_deletes, open_deletes)
        return dict(op)

    def _advance(self, op_name: str) -> dict | None:
        entry = self.operations.get(op_name)
        if entry is None:
            return None
        op = entry["op"]
        if op["status"] == "PENDING":
            op["status"] = "RUNNING"
        elif op["status"] == "RUNNING":
            op["status"] = "DONE"
            op["progress"] = 100
            if entry["error"]:
                op["error"] = {"errors": [entry["error"]]}
                op["httpErrorStatusCode"] = 503
            elif entry["on_done"]:
                entry["on_done"]()
        return dict(op)

    def _new_instance(self, name: str, template: dict | None, body: dict | None = None) -> dict:
        props = (template or {}).get("properties", {})
        nics = (body or {}).get("networkInterfaces") or props.get("networkInterfaces") or [{}]
        ip = nics[0].get("networkIP") or f"10.128.0.{len(self.resources) % 250 + 2}"
        return {
            "kind": "compute#instance",
            "id": str(next(self.ids)),
            "name": name,
            "status": "PROVISIONING",
            "labels": dict(props.get("labels", {})),
            "machineType": props.get("machineType", ""),
            "sourceInstanceTemplate": (template or {}).get("name", ""),
            "networkInterfaces": [{**nic, "networkIP": ip} for nic in nics[:1]] + nics[1:],
            "reservationAffinity": dict(props.get("reservationAffinity", {})),
            "metadata": (body or {}).get("metadata") or props.get("metadata", {}),
        }

    def _release(self, kind: str, name: str) -> None:
        """A deleted VM gives its place in its reservation back."""
        gone = self.resources.pop((kind, name), None)
        values = ((gone or {}).get("reservationAffinity") or {}).get("values") or [""]
        reservation = self.reservations.get(values[0].rsplit("/", 1)[-1])
        if kind == "instances" and reservation:
            reservation["inUseCount"] = max(0, reservation["inUseCount"] - 1)

    def handle(self, method: str, raw_path: str, body: dict | None) -> tuple[int, dict]:
        url = urlparse(raw_path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        with self.lock:
            self.requests.append(Recorded(method, url.path, query, body))
            dash = DASHBOARDS.match(url.path)
            if dash:
                return self._dashboard(method, dash["project"], dash["name"], body)
            if url.path.startswith(("/file/", "/lustre/", "/servicenetworking/")):
                return self._storage_api(method, url.path, query, body)
            for i, (fail_method, part, status) in enumerate(self.fail_once):
                if method == fail_method and part in url.path:
                    del self.fail_once[i]
                    return status, {
                        "error": {
                            "code": status,
                            "message": "Backend unavailable",
                            "errors": [{"reason": "backendError", "message": "try again"}],
                        }
                    }
            match = SCOPED.match(url.path)
            if not match:
                return 404, _error(404, "notFound", f"no route {url.path}")
            scope, rest = match["scope"] or "global", match["rest"]
            parts = rest.split("/")
            kind = parts[0]
            if kind == "operations" and method == "GET":
                op = self._advance(parts[1])
                return (200, op) if op else (404, _error(404, "notFound", "no such operation"))
            if method == "POST" and len(parts) == 1:
                return self._insert(kind, scope, body or {}, query)
            if method == "POST" and parts[1:] == ["bulkInsert"]:
                return self._bulk_insert(scope, body or {})
            if method == "GET" and len(parts) == 1:
                return 200, self._list(kind, query)
            name = parts[1]
            if method == "GET" and len(parts) == 3 and parts[2] == "getGuestAttributes":
                return self._guest_attributes(name)
            if method == "GET":
                res = self.resources.get((kind, name))
                return (200, res) if res else (404, _error(404, "notFound", f"{kind}/{name}"))
            if method == "DELETE":
                if (kind, name) not in self.resources:
                    return 404, _error(
                        404, "notFound", f"The resource '{kind}/{name}' was not found"
                    )
                return 200, self._operation(
                    kind,
                    name,
                    "delete",
                    scope,
                    on_done=lambda: self._release(kind, name),
                )
            if (
                method == "POST"
                and kind == "networks"
                and parts[2:]
                in (
                    ["addPeering"],
                    ["removePeering"],
                )
            ):
                return self._peering(parts[2], name, scope, body or {})
            if method == "POST" and len(parts) == 3 and parts[2] == "reportHostAsFaulty":
                return self._report_faulty(name, scope, body or {})
            if method == "POST" and len(parts) == 3 and parts[2] == "stop" and kind == "instances":
                if (kind, name) not in self.resources:
                    return 404, _error(404, "notFound", f"{kind}/{name}")
                inst = self.resources[(kind, name)]
                return 200, self._operation(
                    kind, name, "stop", scope, on_done=lambda: inst.update(status="TERMINATED")
                )
            if method == "POST" and len(parts) == 3 and parts[2] == "reset":
                if (kind, name) not in self.resources:
                    return 404, _error(404, "notFound", f"{kind}/{name}")

                def rebooted(name: str = name) -> None:
                    self.resources[("instances", name)]["boot"] = (
                        self.resources[("instances", name)].get("boot", 1) + 1
                    )
                    self.booting[name] = [self.reset_old_reads, self.reset_configuring_reads]

                return 200, self._operation(kind, name, "reset", scope, on_done=rebooted)
        return 400, _error(400, "invalid", f"unsupported {method} {url.path}")

    def _insert(self, kind: str, scope: str, body: dict, query: dict) -> tuple[int, dict]:
        name = body.get("name", "")
        if (kind, name) in self.resources:
            return 409, _error(409, "alreadyExists", f"The resource '{kind}/{name}' already exists")
        if kind == "instances":
            template = self._template(query.get("sourceInstanceTemplate", ""))
            props = (template or {}).get("properties", {})
            refused = self._nic_refusal(
                body.get("networkInterfaces") or props.get("networkInterfaces", [])
            ) or self._reservation_refusal(props, 1)
            if refused:
                return refused
            resource = self._new_instance(name, template, body)
            self.resources[(kind, name)] = resource
            return 200, self._operation(
                kind, name, "insert", scope, on_done=lambda: resource.update(status="RUNNING")
            )
        if kind == "images":
            refused = self._image_refusal(body)
            if refused:
                return refused
        resource = {**body, "id": str(next(self.ids)), "selfLink": f"{scope}/{kind}/{name}"}
        if kind == "addresses" and "address" not in resource:
            resource["address"] = f"10.128.0.{200 + len(self.names('addresses'))}"
        if kind == "networks" and body.get("networkProfile", "").endswith("-vpc-roce"):
            resource["mtu"] = body.get("mtu", 8896)
        return 200, self._operation(
            kind,
            name,
            "insert",
            scope,
            on_done=lambda: self.resources.setdefault((kind, name), resource),
        )

    def _image_refusal(self, body: dict) -> tuple[int, dict] | None:
        """As Compute Engine: an image from a boot disk needs that disk's VM stopped
        (without ``forceCreate``), and the disk must exist."""
        disk = body.get("sourceDisk", "").rsplit("/", 1)[-1]
        inst = self.resources.get(("instances", disk))
        if inst is None:
            return 404, _error(404, "notFound", f"The resource 'disks/{disk}' was not found")
        if inst["status"] != "TERMINATED" and not body.get("forceCreate"):
            return 400, _error(
                400,
                "resourceInUseByAnotherResource",
                f"The disk resource 'disks/{disk}' is already being used by 'instances/{disk}'",
            )
        return None

    def _template(self, url: str) -> dict | None:
        return self.resources.get(("instanceTemplates", url.rsplit("/", 1)[-1]))

    def _bulk_insert(self, scope: str, body: dict) -> tuple[int, dict]:
        wanted = list(body.get("perInstanceProperties", {}))
        if self.stockout:
            return 200, self._operation(
                "instances",
                "bulkInsert",
                "bulkInsert",
                scope,
                error={
                    "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                    "message": "The zone 'projects/p/zones/z' does not have enough resources "
                    "available to fulfill the request. Try a different zone, or try again later.",
                },
            )
        taken = [n for n in wanted if ("instances", n) in self.resources]
        if taken:
            return 409, _error(409, "alreadyExists", f"instances exist: {', '.join(taken)}")
        template = self._template(body.get("sourceInstanceTemplate", ""))
        props = (template or {}).get("properties", {})
        refused = self._nic_refusal(props.get("networkInterfaces", [])) or (
            self._reservation_refusal(props, len(wanted))
        )
        if refused:
            return refused
        made = [self._new_instance(n, template) for n in wanted]
        for inst in made:
            self.resources[("instances", inst["name"])] = inst

        def running() -> None:
            for inst in made:
                inst["status"] = "RUNNING"

        return 200, self._operation("instances", "bulkInsert", "bulkInsert", scope, on_done=running)

    def _nic_refusal(self, nics: list[dict]) -> tuple[int, dict] | None:
        """Compute Engine's rule for a RoCE VPC: MRDMA NICs on it and nowhere else."""
        for i, nic in enumerate(nics):
            network = self.resources.get(("networks", nic.get("network", "").rsplit("/", 1)[-1]))
            roce = (network or {}).get("networkProfile", "").endswith("-vpc-roce")
            mrdma = nic.get("nicType") == "MRDMA"
            if roce != mrdma:
                return 400, _error(
                    400,
                    "invalid",
                    f"Invalid value for field 'resource.networkInterfaces[{i}].nicType': "
                    f"'{nic.get('nicType', '')}'. "
                    + (
                        "A network with the RoCE network profile takes only MRDMA NICs."
                        if roce
                        else "An MRDMA NIC must be on a network with the RoCE network profile."
                    ),
                )
        return None

    def _peering(self, verb: str, name: str, scope: str, body: dict) -> tuple[int, dict]:
        network = self.resources.get(("networks", name))
        if network is None:
            return 404, _error(404, "notFound", f"networks/{name}")
        peerings = network.setdefault("peerings", [])
        if verb == "addPeering":
            peering = body.get("networkPeering", {})
            if any(p["name"] == peering.get("name") for p in peerings):
                return 400, _error(400, "invalid", "There is already a peering with this name")
            peerings.append({**peering, "state": "ACTIVE"})
        else:
            network["peerings"] = [p for p in peerings if p["name"] != body.get("name")]
        return 200, self._operation("networks", name, verb, scope)

    def _dashboard(
        self, method: str, project: str, name: str | None, body: dict | None
    ) -> tuple[int, dict]:
        """Cloud Monitoring v1 projects.dashboards: create, get, delete."""
        if method == "POST" and name is None:
            body = body or {}
            dash_id = body.get("name", "").rsplit("/", 1)[-1] or f"d{next(self.ids)}"
            if dash_id in self.dashboards:
                return 409, _error(409, "alreadyExists", f"dashboard {dash_id} exists")
            tiles = (body.get("mosaicLayout") or {}).get("tiles")
            if not body.get("displayName") or not tiles:
                return 400, _error(400, "invalid", "a dashboard needs displayName and tiles")
            for tile in tiles:
                for data in tile["widget"]["xyChart"]["dataSets"]:
                    query = data["timeSeriesQuery"]["timeSeriesFilter"]["filter"]
                    if "metric.type=" not in query:
                        return 400, _error(400, "invalid", f"bad filter {query}")
            self.dashboards[dash_id] = {**body, "name": f"projects/{project}/dashboards/{dash_id}"}
            return 200, self.dashboards[dash_id]
        if name and name in self.dashboards:
            if method == "DELETE":
                del self.dashboards[name]
                return 200, {}
            return 200, self.dashboards[name]
        return 404, _error(404, "notFound", f"dashboard {name}")

    def _report_faulty(self, name: str, scope: str, body: dict) -> tuple[int, dict]:
        """instances.reportHostAsFaulty: the VM moves to another host and boots again;
        refused for machine types and provisioning models Google does not support."""
        inst = self.resources.get(("instances", name))
        if inst is None:
            return 404, _error(404, "notFound", f"instances/{name}")
        template = self._template(inst.get("sourceInstanceTemplate", ""))
        props = (template or {}).get("properties", {})
        model = props.get("scheduling", {}).get("provisioningModel", "STANDARD")
        if inst.get("machineType") not in FAULTY_HOST_TYPES or model != "RESERVATION_BOUND":
            return 400, _error(
                400,
                "invalid",
                f"reportHostAsFaulty is not supported for machine type "
                f"'{inst.get('machineType')}' with provisioning model '{model}'.",
            )
        reasons = body.get("faultReasons") or []
        if body.get("disruptionSchedule") not in ("IMMEDIATE", "FUTURE") or not reasons:
            return 400, _error(400, "invalid", "disruptionSchedule and faultReasons required")

        def moved() -> None:
            inst["boot"] = inst.get("boot", 1) + 1
            inst["host"] = inst.get("host", 0) + 1
            self.booting[name] = [self.reset_old_reads, self.reset_configuring_reads]

        return 200, self._operation("instances", name, "reportHostAsFaulty", scope, on_done=moved)

    def _storage_op(self, api: str, prefix: str, on_done=None, error: str = "") -> dict:
        op_name = f"{prefix}operations/op-{next(self.ids)}"
        self.storage_ops[op_name] = {"reads": 0, "on_done": on_done, "error": error}
        return {"name": op_name, "done": False}

    def _storage_api(
        self, method: str, path: str, query: dict, body: dict | None
    ) -> tuple[int, dict]:
        """Filestore v1, Managed Lustre v1 and Service Networking v1: create (a
        long-running operation, then READY/ACTIVE), get, delete; 404 and 409."""
        op = STORAGE_OPS.match(path)
        if op and method == "GET":
            entry = self.storage_ops.get(op["op"])
            if entry is None:
                return 404, _error(404, "notFound", op["op"])
            entry["reads"] += 1
            if entry["reads"] < 2:
                return 200, {"name": op["op"], "done": False}
            if entry["on_done"]:
                entry["on_done"]()
                entry["on_done"] = None
            if entry["error"]:
                return 200, {"name": op["op"], "done": True, "error": {"message": entry["error"]}}
            return 200, {"name": op["op"], "done": True, "response": {}}
        if path.startswith(CONNECTIONS):
            return self._connections(method, path, query, body or {})
        match = STORAGE.match(path)
        if not match:
            return 404, _error(404, "notFound", f"no route {path}")
        api, name = match["api"], match["name"]
        prefix = f"projects/{match['project']}/locations/{match['zone']}/"
        if method == "POST" and name is None:
            name = query.get("instanceId", "")
            if (api, name) in self.storage:
                return 409, _error(409, "alreadyExists", f"instance {name} exists")
            refused = self._storage_shape(api, body or {})
            if refused:
                return 400, _error(400, "invalid", refused)
            inst = {**(body or {}), "name": f"{prefix}instances/{name}", "state": "CREATING"}
            self.storage[(api, name)] = inst
            n = len(self.storage)
            ip = f"10.{20 if api == 'file' else 30}.0.{n + 1}"

            def ready() -> None:
                if api == "file":
                    inst["state"] = "READY"
                    inst["networks"][0]["ipAddresses"] = [ip]
                else:
                    inst["state"] = "ACTIVE"
                    inst["mountPoint"] = f"{ip}@tcp:/{inst['filesystem']}"

            return 200, self._storage_op(api, prefix, on_done=ready)
        inst = self.storage.get((api, name or ""))
        if inst is None:
            return 404, _error(404, "notFound", f"instance {name} not found")
        if method == "GET":
            return 200, inst
        if method == "DELETE":
            return 200, self._storage_op(
                api, prefix, on_done=lambda: self.storage.pop((api, name), None)
            )
        return 400, _error(400, "invalid", f"unsupported {method} {path}")

    def _storage_shape(self, api: str, body: dict) -> str:
        """What the real API would refuse in a create body ('' when it takes it)."""
        if api == "file":
            shares, nets = body.get("fileShares") or [], body.get("networks") or []
            if body.get("tier") not in ("BASIC_HDD", "BASIC_SSD", "ZONAL", "REGIONAL"):
                return f"invalid tier {body.get('tier')}"
            if len(shares) != 1 or not shares[0].get("name") or not shares[0].get("capacityGb"):
                return "fileShares needs one share with name and capacityGb"
            if len(nets) != 1 or not nets[0].get("network"):
                return "networks needs one network"
            psa = nets[0].get("connectMode") == "PRIVATE_SERVICE_ACCESS"
            if psa and not self._has_connection(nets[0]["network"]):
                return "private service access is not set up on the network"
            return ""
        for key in ("filesystem", "capacityGib", "network", "perUnitStorageThroughput"):
            if not body.get(key):
                return f"{key} is required"
        if not self._has_connection(body["network"]):
            return "private service access is not set up on the network"
        return ""

    def _has_connection(self, network: str) -> bool:
        short = network.rsplit("/", 1)[-1]
        return any(n.rsplit("/", 1)[-1] == short for n in self.connections)

    def _connections(self, method: str, path: str, query: dict, body: dict) -> tuple[int, dict]:
        prefix = ""  # Service Networking names its operations operations/<id>
        if method == "GET":
            conn = self.connections.get(query.get("network", ""))
            return 200, {"connections": [conn] if conn else []}
        ranges = body.get("reservedPeeringRanges")
        if method == "POST" and path == CONNECTIONS:
            if not body.get("network") or not ranges:
                return 400, _error(400, "invalid", "network and reservedPeeringRanges required")
            if body["network"] in self.connections:
                return 409, _error(409, "alreadyExists", "connection exists")
            missing = [
                r for r in ranges if ("addresses", r) not in self.resources
            ]  # global ones too
            if missing:
                return 400, _error(400, "invalid", f"no allocated range {missing[0]}")
            conn = {
                "network": body["network"],
                "reservedPeeringRanges": list(ranges),
                "peering": "servicenetworking-googleapis-com",
                "service": "services/servicenetworking.googleapis.com",
            }

            def made() -> None:
                self.connections[body["network"]] = conn

            return 200, self._storage_op("servicenetworking", prefix, on_done=made)
        if method == "PATCH":
            conn = self.connections.get(body.get("network", ""))
            if conn is None:
                return 404, _error(404, "notFound", "no connection")
            return 200, self._storage_op(
                "servicenetworking",
                prefix,
                on_done=lambda: conn.update(reservedPeeringRanges=list(ranges or [])),
            )
        if method == "POST" and path.endswith(":deleteConnection"):
            network = body.get("consumerNetwork", "")
            if network not in self.connections:
                return 404, _error(404, "notFound", "no connection")
            return 200, self._storage_op(
                "servicenetworking", prefix, on_done=lambda: self.connections.pop(network, None)
            )
        return 400, _error(400, "invalid", f"unsupported {method} {path}")

    def _reservation_refusal(self, props: dict, count: int) -> tuple[int, dict] | None:
        """What Compute Engine answers a VM its reservation cannot take (None: it fits)."""
        scheduling = props.get("scheduling", {})
        affinity = props.get("reservationAffinity", {})
        bound = scheduling.get("provisioningModel") == "RESERVATION_BOUND"
        specific = affinity.get("consumeReservationType") == "SPECIFIC_RESERVATION"
        if bound and not specific:
            return 400, _error(
                400,
                "invalid",
                "Invalid value for field 'resource.scheduling.provisioningModel': "
                "'RESERVATION_BOUND'. Reservation-bound VMs must use ReservationAffinity of "
                "SPECIFIC_RESERVATION.",
            )
        if bound and props.get("resourcePolicies"):
            return 400, _error(
                400,
                "invalid",
                "Invalid value for field 'resource.resourcePolicies': a reservation-bound VM "
                "is placed by its reservation and takes no placement policy.",
            )
        if bound and "instanceTerminationAction" not in scheduling:
            return 400, _error(
                400,
                "invalid",
                "Required field 'resource.scheduling.instanceTerminationAction' not specified "
                "for a reservation-bound VM.",
            )
        if not specific:
            return None
        name = (affinity.get("values") or [""])[0].rsplit("/", 1)[-1]
        reservation = self.reservations.get(name)
        if reservation is None:
            return 400, _error(
                400,
                "invalid",
                f"Could not find the given reservation with the following name: {name}",
            )
        if reservation["machineType"] != props.get("machineType"):
            return 400, _error(
                400,
                "invalid",
                f"Specified reservation '{name}' does not match the reservation's machine type "
                f"{reservation['machineType']}.",
            )
        left = reservation["count"] - reservation["inUseCount"]
        if count > left:
            return 429, _error(
                429,
                "rateLimitExceeded",
                f"Reservation does not have enough resources for the request: specific "
                f"reservation '{name}' is insufficient: required {count} and short of "
                f"{count - left} VM count.",
            )
        reservation["inUseCount"] += count
        return None

    def _list(self, kind: str, query: dict) -> dict:
        items = [r for (k, _), r in sorted(self.resources.items()) if k == kind]
        match = re.match(r"labels\.([\w-]+)=(\S+)", query.get("filter", ""))
        if match:
            items = [r for r in items if r.get("labels", {}).get(match[1]) == match[2]]
        return {"kind": f"compute#{kind}List", "items": items}

    def _guest_attributes(self, name: str) -> tuple[int, dict]:
        inst = self.resources.get(("instances", name))
        if not inst or inst["status"] != "RUNNING" or name in self.never_ready:
            return 404, _error(404, "notFound", "The resource was not found")
        metadata = {i["key"]: i["value"] for i in inst.get("metadata", {}).get("items", [])}
        if metadata.get("mtc-role") == "image-builder":  # its script's own attribute
            items = [{"namespace": "mtc", "key": "image", "value": self.image_build_result}]
            return 200, {"queryPath": "mtc/", "queryValue": {"items": items}}
        role = "slurmctld" if name.endswith("-controller") else "slurmd"
        boot, state = inst.setdefault("boot", 1), "ready"
        phases = self.booting.get(name)
        if phases and phases[0] > 0:  # the reset VM still shows its last boot's values
            phases[0] -= 1
            boot -= 1
        elif phases and phases[1] > 0:  # the new boot's script is running
            phases[1] -= 1
            state = "configuring"
        items = [
            {"namespace": "mtc", "key": "boot", "value": f"boot-{boot}"},
            {"namespace": "mtc", "key": "state", "value": state},
            {"namespace": "mtc", "key": role, "value": "ready" if state == "ready" else "booting"},
        ]
        return 200, {"queryPath": "mtc/", "queryValue": {"items": items}}


def _error(code: int, reason: str, message: str) -> dict:
    return {
        "error": {
            "code": code,
            "message": message,
            "errors": [{"reason": reason, "message": message}],
        }
    }


class _Handler(BaseHTTPRequestHandler):
    fake: FakeCompute

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        status, payload = self.server.fake.handle(self.command, self.path, body)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve

    def log_message(self, *args) -> None:  # quiet
        pass


class FakeServer:
    """The HTTP server on 127.0.0.1:<free port>, in a thread."""

    def __init__(self, fake) -> None:
        self.fake = fake
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.fake = fake
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_port}"

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class FakeSlurm:
    """Slurm's side of a cloud cluster, as seen from mtc: every RUNNING worker instance
    of the fake Compute API is a node, idle unless drained. Records what mtc asks."""

    def __init__(self, fake: FakeCompute) -> None:
        self.fake = fake
        self.drained: list[str] = []
        self.deleted: list[str] = []
        self.updates: list[tuple[tuple[str, ...], str]] = []
        self.unregistered: set[str] = set()  # booted and reported ready, unknown to slurmctld

    def nodes(self):
        from slurm.client import SlurmNode

        out = []
        for (kind, name), inst in sorted(self.fake.resources.items()):
            if kind != "instances" or name.endswith("-controller"):
                continue
            if inst["status"] != "RUNNING" or name in self.deleted or name in self.unregistered:
                continue
            flags = ("DRAIN",) if name in self.drained else ()
            out.append(SlurmNode(name, "IDLE", flags, "", 2, ""))
        return out

    def node_update(self, names: list[str], *, state: str, reason: str = "") -> None:
        self.updates.append((tuple(names), state))
        if state == "DRAIN":
            self.drained += names
        elif state == "RESUME":
            self.drained = [n for n in self.drained if n not in names]

    def job(self, job_id: str):
        return None  # no jobs run on the fake cluster

    def node_jobs(self, name: str) -> list[str]:
        return []

    def node_delete(self, names: list[str]) -> None:
        self.deleted += names

    def ping(self) -> bool:
        return True

    def cancel_all(self) -> None:
        pass


class FakeMonitoring:
    """Cloud Monitoring's MetricService on a local plain-text gRPC port: the real
    google-cloud-monitoring client (its only transport is gRPC) talks to it. Keeps the
    series it is given or sent; ListTimeSeries filters by metric type and instance."""

    def __init__(self) -> None:
        from concurrent import futures

        import grpc
        from google.cloud import monitoring_v3
        from google.protobuf import empty_pb2

        self.series: list = []  # monitoring_v3.TimeSeries
        self.list_requests: list = []
        self.create_requests: list = []
        m = monitoring_v3
        handlers = {
            "ListTimeSeries": grpc.unary_unary_rpc_method_handler(
                self._list,
                request_deserializer=m.ListTimeSeriesRequest.deserialize,
                response_serializer=m.ListTimeSeriesResponse.serialize,
            ),
            "CreateTimeSeries": grpc.unary_unary_rpc_method_handler(
                self._create,
                request_deserializer=m.CreateTimeSeriesRequest.deserialize,
                response_serializer=empty_pb2.Empty.SerializeToString,
            ),
        }
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("google.monitoring.v3.MetricService", handlers),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> FakeMonitoring:
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop(grace=None)

    def add_gpu_points(self, instance: str, metric_type: str, gpu: int, points) -> None:
        """Points [(datetime, value)] as the Ops Agent would publish them."""
        from google.cloud import monitoring_v3 as m

        self.series.append(
            m.TimeSeries(
                metric={"type": metric_type, "labels": {"gpu_number": str(gpu)}},
                resource={"type": "gce_instance", "labels": {"instance_id": "1"}},
                metadata={"system_labels": {"name": instance}},
                points=[
                    m.Point(
                        interval=m.TimeInterval(end_time=when),
                        value=m.TypedValue(double_value=value),
                    )
                    for when, value in points
                ],
            )
        )

    def _list(self, request, context):
        from google.cloud import monitoring_v3 as m

        self.list_requests.append(request)
        metric = re.search(r'metric\.type = "([^"]+)"', request.filter)
        name = re.search(r'metadata\.system_labels\.name = "([^"]+)"', request.filter)
        found = [
            s
            for s in self.series
            if (not metric or s.metric.type == metric[1])
            and (not name or s.metadata.system_labels["name"] == name[1])
        ]
        return m.ListTimeSeriesResponse(time_series=found)

    def _create(self, request, context):
        from google.protobuf import empty_pb2

        self.create_requests.append(request)
        self.series.extend(request.time_series)
        return empty_pb2.Empty()
