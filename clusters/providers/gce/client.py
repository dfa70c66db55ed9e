"""The one place mtc talks to Compute Engine (google-cloud-compute, REST transport).

Every client, the operations clients included, is built with the same
ClientOptions, so one setting points all of them at Google or at a local test
endpoint (docs/gce.md: the ``*_unary`` methods, our own operation polling).
Calls retry transient errors with backoff; the rest become ProviderErrors."""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.cloud import compute_v1

from ..base import ProviderError
from .errors import TRANSIENT_CODES, Transient, error_for, from_http
from .plan import ApiRequest, Target

log = logging.getLogger(__name__)
DONE = compute_v1.Operation.Status.DONE


@dataclass(frozen=True)
class Kind:
    """How one REST resource maps onto the python client."""

    client: str  # compute_v1 client class name
    message: str  # compute_v1 message class for the body
    name_arg: str  # keyword that names one resource (get/delete)
    body_arg: str  # keyword that carries the insert body
    scope: str  # global, region or zone


KINDS = {
    "networks": Kind("NetworksClient", "Network", "network", "network_resource", "global"),
    "subnetworks": Kind(
        "SubnetworksClient", "Subnetwork", "subnetwork", "subnetwork_resource", "region"
    ),
    "firewalls": Kind("FirewallsClient", "Firewall", "firewall", "firewall_resource", "global"),
    "globalAddresses": Kind(
        "GlobalAddressesClient", "Address", "address", "address_resource", "global"
    ),
    "addresses": Kind("AddressesClient", "Address", "address", "address_resource", "region"),
    "resourcePolicies": Kind(
        "ResourcePoliciesClient",
        "ResourcePolicy",
        "resource_policy",
        "resource_policy_resource",
        "region",
    ),
    "instanceTemplates": Kind(
        "InstanceTemplatesClient",
        "InstanceTemplate",
        "instance_template",
        "instance_template_resource",
        "global",
    ),
    "instances": Kind("InstancesClient", "Instance", "instance", "instance_resource", "zone"),
    "images": Kind("ImagesClient", "Image", "image", "image_resource", "global"),
}
OPERATION_CLIENTS = {
    "global": "GlobalOperationsClient",
    "region": "RegionOperationsClient",
    "zone": "ZoneOperationsClient",
}


def client_options() -> ClientOptions | None:
    endpoint = settings.MTC_GCE_API_ENDPOINT
    return ClientOptions(api_endpoint=endpoint) if endpoint else None


def credentials():
    """Application Default Credentials, or anonymous ones for a local test endpoint."""
    if settings.MTC_GCE_ANONYMOUS:
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    return None  # the clients find ADC themselves


class ComputeApi:
    def __init__(self, target: Target) -> None:
        self.target = target
        self._clients: dict[str, Any] = {}

    # --- plumbing ---------------------------------------------------------------
    def _client(self, name: str):
        if name not in self._clients:
            self._clients[name] = getattr(compute_v1, name)(
                transport="rest", client_options=client_options(), credentials=credentials()
            )
        return self._clients[name]

    def _scope_args(self, scope: str) -> dict[str, str]:
        args = {"project": self.target.project}
        if scope == "region":
            args["region"] = self.target.region
        elif scope == "zone":
            args["zone"] = self.target.zone
        return args

    def _call(self, where: str, fn, **kwargs):
        """One API call, retried while the error is transient."""
        delay = settings.MTC_GCE_POLL_S
        for attempt in range(settings.MTC_GCE_RETRIES + 1):
            try:
                return fn(**kwargs)
            except Exception as exc:  # noqa: BLE001 - classified just below
                error = from_http(exc, where=where)
                if not isinstance(error, Transient) or attempt == settings.MTC_GCE_RETRIES:
                    if isinstance(error, Transient):
                        raise ProviderError(
                            f"{error} (gave up after {attempt + 1} tries)", code="GCE_UNAVAILABLE"
                        ) from exc
                    raise error from exc
                log.info("transient error, retrying: %s", error)
                time.sleep(delay)
                delay = min(delay * 2, 10)
        raise AssertionError("unreachable")

    def wait(self, operation, scope: str, *, where: str, timeout: float | None = None) -> None:
        """Poll an Operation until DONE; raise its first error as a ProviderError."""
        ops = self._client(OPERATION_CLIENTS[scope])
        deadline = time.monotonic() + (timeout or settings.MTC_GCE_OPERATION_TIMEOUT_S)
        delay = settings.MTC_GCE_POLL_S
        while operation.status != DONE:
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"{where}: operation {operation.name} did not finish in time", code="TIMEOUT"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 10)
            operation = self._call(
                where, ops.get, operation=operation.name, **self._scope_args(scope)
            )
        errors = list(operation.error.errors) if operation.error else []
        if errors:
            first = errors[0]
            if first.code in TRANSIENT_CODES:
                raise Transient(f"{where}: {first.code}: {first.message}")
            raise error_for(first.code, first.message, where=where)

    # --- requests from the plan ----------------------------------------------------
    def send(self, request: ApiRequest, *, timeout: float | None = None) -> None:
        """Send one planned request and wait for its Operation. "if missing" requests
        look first, and treat 409 alreadyExists as done (a retry after a crash)."""
        kind = KINDS[request.resource]
        where = f"{request.resource}.{request.verb} {request.name}"
        if request.when == "if missing" and self.exists(request.resource, request.name):
            return
        client = self._client(kind.client)
        args = self._scope_args(kind.scope)
        for attempt in range(settings.MTC_GCE_RETRIES + 1):
            try:
                if request.verb == "bulkInsert":
                    body = compute_v1.BulkInsertInstanceResource.from_json(json.dumps(request.body))
                    op = self._call(
                        where,
                        client.bulk_insert_unary,
                        bulk_insert_instance_resource_resource=body,
                        **args,
                    )
                elif request.verb == "insert" and "sourceInstanceTemplate" in request.query:
                    insert = compute_v1.InsertInstanceRequest(
                        instance_resource=compute_v1.Instance.from_json(json.dumps(request.body)),
                        source_instance_template=request.query["sourceInstanceTemplate"],
                        **args,
                    )
                    op = self._call(where, client.insert_unary, request=insert)
                elif request.verb == "insert":
                    body = getattr(compute_v1, kind.message).from_json(json.dumps(request.body))
                    op = self._call(where, client.insert_unary, **{kind.body_arg: body}, **args)
                elif request.verb in ("addPeering", "removePeering"):
                    message = "NetworksAddPeeringRequest"
                    arg = "networks_add_peering_request_resource"
                    if request.verb == "removePeering":
                        message = "NetworksRemovePeeringRequest"
                        arg = "networks_remove_peering_request_resource"
                    body = getattr(compute_v1, message).from_json(json.dumps(request.body))
                    fn = client.add_peering_unary
                    if request.verb == "removePeering":
                        fn = client.remove_peering_unary
                    op = self._call(where, fn, network=request.name, **{arg: body}, **args)
                elif request.verb == "reportHostAsFaulty":
                    body = compute_v1.InstancesReportHostAsFaultyRequest.from_json(
                        json.dumps(request.body)
                    )
                    op = self._call(
                        where,
                        client.report_host_as_faulty_unary,
                        instance=request.name,
                        instances_report_host_as_faulty_request_resource=body,
                        **args,
                    )
                else:  # delete, reset: act on one named resource
                    fn = getattr(client, f"{request.verb}_unary")
                    op = self._call(where, fn, **{kind.name_arg: request.name}, **args)
                self.wait(op, kind.scope, where=where, timeout=timeout)
                return
            except ProviderError as exc:
                if exc.code == "ALREADY_EXISTS" and request.verb in ("insert", "bulkInsert"):
                    return  # made by an earlier try whose answer was lost
                if exc.code == "NOT_FOUND" and request.verb == "delete":
                    return  # deleted already: what delete wanted
                raise
            except Transient as exc:
                if attempt == settings.MTC_GCE_RETRIES:
                    raise ProviderError(str(exc), code="GCE_UNAVAILABLE") from exc
                time.sleep(settings.MTC_GCE_POLL_S * (attempt + 1))

    def send_all(self, requests: list[ApiRequest], *, workers: int = 16) -> None:
        """Independent requests (deleting many instances) side by side: Compute Engine
        runs their operations at once, so N deletes take about as long as one. Every
        request is tried; the first failure is raised after all have finished."""
        if len(requests) <= 1:
            for request in requests:
                self.send(request)
            return
        with ThreadPoolExecutor(max_workers=min(workers, len(requests))) as pool:
            futures = [pool.submit(self.send, request) for request in requests]
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            raise errors[0]

    def get(self, resource: str, name: str):
        """One resource, or None if there is none."""
        kind = KINDS[resource]
        client = self._client(kind.client)
        try:
            return client.get(**{kind.name_arg: name}, **self._scope_args(kind.scope))
        except gexc.NotFound:
            return None
        except Exception as exc:  # noqa: BLE001
            raise from_http(exc, where=f"{resource}.get {name}") from exc

    def exists(self, resource: str, name: str) -> bool:
        kind = KINDS[resource]
        client = self._client(kind.client)
        try:
            client.get(**{kind.name_arg: name}, **self._scope_args(kind.scope))
        except gexc.NotFound:
            return False
        except Exception as exc:  # noqa: BLE001
            raise from_http(exc, where=f"{resource}.get {name}") from exc
        return True

    # --- instances -------------------------------------------------------------------
    def instances(self, cluster_id: str) -> dict[str, compute_v1.Instance]:
        """The cluster's instances by name (one filtered list call, all pages)."""
        client = self._client("InstancesClient")
        pager = self._call(
            "instances.list",
            client.list,
            request=compute_v1.ListInstancesRequest(
                project=self.target.project,
                zone=self.target.zone,
                filter=f"labels.mtc-cluster={cluster_id}",
            ),
        )
        return {inst.name: inst for inst in pager}

    def guest_attributes(self, instance: str) -> dict[str, str]:
        """The ``mtc/`` guest attributes the startup script reports (state, slurmd)."""
        client = self._client("InstancesClient")
        try:
            result = client.get_guest_attributes(
                request=compute_v1.GetGuestAttributesInstanceRequest(
                    instance=instance, query_path="mtc/", **self._scope_args("zone")
                )
            )
        except gexc.NotFound:  # no attributes yet, or no such instance
            return {}
        except Exception as exc:  # noqa: BLE001
            error = from_http(exc, where=f"instances.getGuestAttributes {instance}")
            if isinstance(error, Transient):
                return {}
            raise error from exc
        items = result.query_value.items if result.query_value else []
        return {item.key: item.value for item in items}
