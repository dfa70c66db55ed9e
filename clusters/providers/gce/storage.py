"""A gce cluster's shared storage: Filestore ``/home`` and Managed Lustre, made or checked.

A spec entry that names an ``instance`` is checked (it exists, is ready, is on the
cluster's network) and mounted at its address as read back; one with neither
``instance`` nor ``ip`` is made by mtc (``<cluster>-home``, ``<cluster>-<filesystem>``)
after the service-networking peering private services need, and deleted with the
cluster; one with ``ip`` is a server mtc does not manage (NFS), mounted as given.

No typed clients are installed (google-cloud-filestore and google-cloud-lustre are the
typed path), so these are the REST APIs' JSON (file.googleapis.com/v1,
lustre.googleapis.com/v1, servicenetworking.googleapis.com/v1) sent with an authorized
requests session, as dashboard.py does."""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from google.api_core import exceptions as gexc

from ..base import ProviderError
from . import names
from .api import Target
from .networks import needs_private_services, primary_network

log = logging.getLogger(__name__)
FILESTORE_READY = "READY"  # Filestore v1 Instance.State
LUSTRE_READY = "ACTIVE"  # Managed Lustre v1 Instance.State
FILESTORE_TIERS = {"BASIC_HDD": 1024, "BASIC_SSD": 2560, "ZONAL": 1024, "REGIONAL": 1024}
DEFAULT_FILESTORE_TIER = "BASIC_SSD"
SERVICE = "services/servicenetworking.googleapis.com"
PEERING = "servicenetworking-googleapis-com"  # the peering Google names the connection
IP_PLACEHOLDER = "<address read at create>"


@dataclass(frozen=True)
class Share:
    """One Filestore or Lustre instance the cluster mounts."""

    kind: str  # filestore or lustre
    field: str  # where in the spec: storage.home, storage.lustre[0]
    name: str  # the instance id
    made: bool  # mtc creates (and deletes) it; else it only checks it
    body: dict[str, Any] | None  # the create body (made only)


def shares(spec: dict, target: Target) -> list[Share]:
    """The instances the spec asks for (made) or names (checked); ``ip`` entries are not."""
    storage = spec.get("storage") or {}
    cid = spec["cluster_id"]
    network = names.network_url(target.project, primary_network(spec, target)[0])
    labels = {names.LABEL_CLUSTER: cid}
    out: list[Share] = []
    home = storage.get("home")
    if home and home.get("type", "filestore") == "filestore" and not home.get("ip"):
        made = not home.get("instance")
        tier = home.get("tier", DEFAULT_FILESTORE_TIER)
        body = {
            "tier": tier,
            "fileShares": [
                {
                    "name": home["share"],
                    "capacityGb": str(home.get("capacity_gib") or FILESTORE_TIERS[tier]),
                }
            ],
            "networks": [
                {
                    "network": network,
                    "modes": ["MODE_IPV4"],
                    "connectMode": "PRIVATE_SERVICE_ACCESS",
                    "reservedIpRange": names.psa_range_name(cid),
                }
            ],
            "labels": labels,
        }
        name = home.get("instance") or names.resource_name(cid, "home")
        out.append(Share("filestore", "storage.home", name, made, body if made else None))
    for i, item in enumerate(storage.get("lustre") or []):
        if item.get("ip"):
            continue
        made = not item.get("instance")
        body = {
            "filesystem": item["filesystem"],
            "capacityGib": str(item.get("capacity_gib", 0)),
            "network": network,
            "perUnitStorageThroughput": str(item.get("performance_tier_mbps_per_tib", 0)),
            "labels": labels,
        }
        name = item.get("instance") or names.resource_name(cid, item["filesystem"])
        out.append(Share("lustre", f"storage.lustre[{i}]", name, made, body if made else None))
    return out


def with_ips(spec: dict, ips: dict[str, str]) -> dict:
    """The spec with each managed share's address filled in (by spec field)."""
    spec = copy.deepcopy(spec)
    storage = spec.get("storage") or {}
    if "storage.home" in ips:
        storage["home"]["ip"] = ips["storage.home"]
    for i, item in enumerate(storage.get("lustre") or []):
        if f"storage.lustre[{i}]" in ips:
            item["ip"] = ips[f"storage.lustre[{i}]"]
    return spec


def planned(spec: dict, target: Target) -> tuple[dict, list[dict[str, Any]]]:
    """For a plan shown before create: the spec with placeholder addresses, and the
    storage requests create sends (made) or the checks it does (named)."""
    found = shares(spec, target)
    described: list[dict[str, Any]] = []
    if needs_private_services(spec):
        described.append(
            {
                "method": "servicenetworking.services.connections.create",
                "http": f"POST /v1/{SERVICE}/connections",
                "when": "if the network has none (else its ranges are extended)",
                "body": _connection_body(spec, target, [names.psa_range_name(spec["cluster_id"])]),
            }
        )
    for share in found:
        api = "file" if share.kind == "filestore" else "lustre"
        base = f"/v1/projects/{target.project}/locations/{target.zone}/instances"
        if share.made:
            described.append(
                {
                    "method": f"{api}.instances.create",
                    "http": f"POST {base}?instanceId={share.name}",
                    "name": share.name,
                    "when": "if missing",
                    "body": share.body,
                }
            )
        else:
            described.append(
                {
                    "method": f"{api}.instances.get",
                    "http": f"GET {base}/{share.name}",
                    "name": share.name,
                    "when": "checked: exists, ready, on the cluster's network",
                }
            )
    return with_ips(spec, {s.field: IP_PLACEHOLDER for s in found}), described


def _connection_body(spec: dict, target: Target, ranges: list[str]) -> dict[str, Any]:
    network = names.network_url(target.project, primary_network(spec, target)[0])
    return {"network": network, "reservedPeeringRanges": ranges}


class RestApi:
    """One Google REST API (JSON over an authorized requests session)."""

    def __init__(self, endpoint: str, label: str) -> None:
        self.base = endpoint.rstrip("/")
        self.label = label
        if settings.MTC_GCE_ANONYMOUS:
            import requests

            self.session = requests.Session()
        else:
            import google.auth
            from google.auth.transport.requests import AuthorizedSession

            creds, _ = google.auth.default(
                scopes=["https://www.googleapis.com/auth/cloud-platform"]
            )
            self.session = AuthorizedSession(creds)

    def call(
        self, method: str, path: str, *, body: dict | None = None, ok: tuple[int, ...] = ()
    ) -> tuple[int, dict]:
        try:
            response = self.session.request(method, f"{self.base}/{path}", json=body, timeout=30)
        except OSError as exc:
            raise ProviderError(f"{self.label}: {exc}", code="GCE_UNAVAILABLE") from exc
        if response.status_code >= 400 and response.status_code not in ok:
            error = gexc.from_http_response(response)
            raise ProviderError(
                f"{self.label} {method} {path}: {error.message}", code="GCE_STORAGE_ERROR"
            )
        return response.status_code, (response.json() if response.content else {})

    def wait(self, operation: dict, where: str) -> dict:
        """Poll a long-running operation (``name``, ``done``) until done."""
        deadline = time.monotonic() + settings.MTC_GCE_STORAGE_TIMEOUT_S
        while not operation.get("done"):
            if time.monotonic() > deadline:
                raise ProviderError(f"{where}: did not finish in time", code="TIMEOUT")
            time.sleep(settings.MTC_GCE_POLL_S)
            operation = self.call("GET", f"v1/{operation['name']}")[1]
        if operation.get("error"):
            raise ProviderError(
                f"{where}: {operation['error'].get('message', operation['error'])}",
                code="GCE_STORAGE_ERROR",
            )
        return operation


def _apis() -> dict[str, RestApi]:
    return {
        "filestore": RestApi(settings.MTC_GCE_FILESTORE_ENDPOINT, "Filestore"),
        "lustre": RestApi(settings.MTC_GCE_LUSTRE_ENDPOINT, "Managed Lustre"),
    }


def _instance_path(target: Target, name: str = "") -> str:
    path = f"v1/projects/{target.project}/locations/{target.zone}/instances"
    return f"{path}/{name}" if name else path


def _address(share: Share, instance: dict) -> str:
    if share.kind == "filestore":
        ips = ((instance.get("networks") or [{}])[0]).get("ipAddresses") or []
        return ips[0] if ips else ""
    return (instance.get("mountPoint") or "").split("@", 1)[0]


def _check(share: Share, instance: dict | None, network: str, filesystem: str = "") -> str:
    """The instance's address, or a permanent error saying what is wrong with it."""
    what = f"{share.field}: {share.kind} instance '{share.name}'"

    def bad(why: str) -> ProviderError:
        return ProviderError(f"{what} {why}", code="STORAGE_NOT_USABLE", permanent=True)

    if instance is None:
        raise bad("does not exist in the cluster's zone")
    ready = FILESTORE_READY if share.kind == "filestore" else LUSTRE_READY
    if instance.get("state") != ready:
        raise bad(f"is {instance.get('state', 'in no state')}, not {ready}")
    if share.kind == "filestore":
        on = ((instance.get("networks") or [{}])[0]).get("network", "")
    else:
        on = instance.get("network", "")
    if on.rsplit("/", 1)[-1] != network:
        raise bad(f"is on network '{on}', not the cluster's '{network}'")
    if filesystem and instance.get("filesystem") not in (None, filesystem):
        raise bad(f"holds file system '{instance.get('filesystem')}', not '{filesystem}'")
    ip = _address(share, instance)
    if not ip:
        raise bad("reports no address")
    return ip


def _get(api: RestApi, target: Target, name: str) -> dict | None:
    status, body = api.call("GET", _instance_path(target, name), ok=(404,))
    return None if status == 404 else body


def ensure_connection(spec: dict, target: Target, record: Callable[[str], None]) -> None:
    """The service-networking connection on the cluster's network holds mtc's range:
    made if missing (recorded ``made``), else extended (recorded ``extended``)."""
    api = RestApi(settings.MTC_GCE_SERVICENETWORKING_ENDPOINT, "Service Networking")
    wanted = names.psa_range_name(spec["cluster_id"])
    body = _connection_body(spec, target, [wanted])
    existing = _connection(api, body["network"])
    if existing is None:
        record("made")
        op = api.call("POST", f"v1/{SERVICE}/connections", body=body)[1]
    elif wanted not in existing.get("reservedPeeringRanges", []):
        record("extended")
        body["reservedPeeringRanges"] = [*existing.get("reservedPeeringRanges", []), wanted]
        op = api.call(
            "PATCH",
            f"v1/{SERVICE}/connections/-?updateMask=reservedPeeringRanges&force=true",
            body=body,
        )[1]
    else:
        return
    api.wait(op, "servicenetworking connections")


def _connection(api: RestApi, network: str) -> dict | None:
    found = api.call("GET", f"v1/{SERVICE}/connections?network={network}")[1]
    return next(iter(found.get("connections") or []), None)


def ensure(spec: dict, target: Target, record: Callable[[str, str], None]) -> dict[str, str]:
    """Each share made (if missing) or checked; their addresses by spec field.
    ``record(kind, name)`` runs before a create, so a crash still deletes it later."""
    apis = _apis()
    network = primary_network(spec, target)[0]
    storage = spec.get("storage") or {}
    ips: dict[str, str] = {}
    for share in shares(spec, target):
        api = apis[share.kind]
        instance = _get(api, target, share.name)
        if instance is None and share.made:
            record(share.kind, share.name)
            status, op = api.call(
                "POST",
                f"{_instance_path(target)}?instanceId={share.name}",
                body=share.body,
                ok=(409,),
            )
            if status != 409:  # 409: made by an earlier try; wait for it below
                api.wait(op, f"{share.kind} create {share.name}")
            instance = _wait_ready(api, target, share)
        elif instance is not None and share.made:
            instance = _wait_ready(api, target, share)
        filesystem = ""
        if share.kind == "lustre":
            index = int(share.field.rsplit("[", 1)[1].rstrip("]"))
            filesystem = storage["lustre"][index]["filesystem"]
        ips[share.field] = _check(share, instance, network, filesystem)
    return ips


def _wait_ready(api: RestApi, target: Target, share: Share) -> dict | None:
    """An instance mtc made, read back until ready (its address is known only then)."""
    ready = FILESTORE_READY if share.kind == "filestore" else LUSTRE_READY
    deadline = time.monotonic() + settings.MTC_GCE_STORAGE_TIMEOUT_S
    while True:
        instance = _get(api, target, share.name)
        if instance is None or instance.get("state") == ready or time.monotonic() > deadline:
            return instance
        time.sleep(settings.MTC_GCE_POLL_S)


def delete(spec: dict, target: Target, made: dict[str, list[str]]) -> None:
    """What mtc made, gone: its instances (404 counts as done), then its range taken off
    the service-networking connection (the connection deleted if no range is left)."""
    apis = _apis()
    for kind in ("filestore", "lustre"):
        for name in made.get(kind, []):
            status, op = apis[kind].call("DELETE", _instance_path(target, name), ok=(404,))
            if status != 404:
                apis[kind].wait(op, f"{kind} delete {name}")
    if not made.get("connection"):
        return
    api = RestApi(settings.MTC_GCE_SERVICENETWORKING_ENDPOINT, "Service Networking")
    network = _connection_body(spec, target, [])["network"]
    existing = _connection(api, network)
    if existing is None:
        return
    ours = names.psa_range_name(spec["cluster_id"])
    left = [r for r in existing.get("reservedPeeringRanges", []) if r != ours]
    if left:
        op = api.call(
            "PATCH",
            f"v1/{SERVICE}/connections/-?updateMask=reservedPeeringRanges&force=true",
            body={"network": network, "reservedPeeringRanges": left},
        )[1]
    else:
        op = api.call(
            "POST",
            f"v1/{SERVICE}/connections/{PEERING}:deleteConnection",
            body={"consumerNetwork": network},
        )[1]
    api.wait(op, "servicenetworking connections")
