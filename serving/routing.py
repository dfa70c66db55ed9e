"""Routing one completion request: check it, pick the healthy replica with the fewest
requests in flight, forward it, and record how it went (for the figures and scaling)."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from node.replica.generation import RequestError, messages_parse, prompt_parse, sampling_parse

from . import conf, traffic
from .choices import EndpointState, ReplicaState
from .models import Endpoint, Replica
from .selectors import replica_owner_uid
from .services import replica_mark_unhealthy
from .transport import ReplicaTimeout, ReplicaUnreachable, replica_call

MAX_ATTEMPTS = 3  # replicas tried when the first cannot be reached at all
T = TypeVar("T")


class RouteError(Exception):
    """The request was not answered: HTTP ``status`` with mtc's error body."""

    def __init__(self, status: int, code: str, message: str, fields: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.fields = status, code, message, fields or {}


@dataclass
class Routed:
    body: bytes  # the replica's OpenAI-shaped JSON, passed through as it is
    replica_number: int
    attempts: list[str] = field(default_factory=list)


def request_check(body: dict, *, chat: bool, endpoint: Endpoint) -> None:
    """The replica's own checks, run here first so a bad request costs no replica time
    and gets mtc's error shape naming the field."""
    try:
        if not isinstance(body, dict):
            raise RequestError("The body must be a JSON object.")
        if chat:
            if not endpoint.chat:
                raise RequestError(
                    f"{endpoint.version} has no chat template; send a 'prompt' instead.",
                    param="messages",
                )
            messages_parse(body)
        else:
            prompt_parse(body)
        sampling_parse(body)
    except RequestError as exc:
        raise RouteError(
            400,
            "INVALID_ARGUMENT",
            exc.message,
            {exc.param or "non_field_errors": exc.message},
        ) from exc


# How replicas with equally few requests in flight are ordered: at random, so load
# spreads; tests put in a fixed order to meet a given replica first.
tie_break: Callable[[list[Replica]], None] = random.shuffle


def candidates(endpoint: Endpoint) -> list[Replica]:
    """READY replicas, fewest requests in flight first (ties broken at random)."""
    replicas = list(
        Replica.objects.filter(endpoint=endpoint, state=ReplicaState.READY).only(
            "id", "number", "host", "port", "state", "endpoint_id"
        )
    )
    counts = traffic.inflight_counts(endpoint.pk)
    tie_break(replicas)
    replicas.sort(key=lambda r: counts.get(r.number, 0))
    for replica in replicas:
        replica.endpoint = endpoint
    return replicas


def _replica_error(response_body: bytes) -> tuple[str, str | None]:
    try:
        error = json.loads(response_body)["error"]
        return str(error.get("message", "")), error.get("param")
    except (ValueError, KeyError, TypeError, AttributeError):
        return response_body[:200].decode("utf-8", "replace"), None


def _forward(endpoint: Endpoint, replica: Replica, path: str, payload: bytes) -> Routed:
    response = replica_call(
        replica.host,
        replica.port,
        "POST",
        path,
        token=endpoint.replica_token,
        body=payload,
        timeout=conf.request_timeout_s(),
        owner_uid=replica_owner_uid(endpoint),
    )
    if response.status == 200:
        return Routed(body=response.body, replica_number=replica.number)
    raise replica_refused(replica, response.status, response.body)


def replica_refused(replica: Replica, status: int, body: bytes) -> RouteError:
    """The error for a replica's non-200 answer; a replica at fault is marked unhealthy."""
    message, param = _replica_error(body)
    if 400 <= status < 500 and status != 401:
        return RouteError(400, "INVALID_ARGUMENT", message, {param or "non_field_errors": message})
    # A server error, or a replica that does not know its token: not fit to serve.
    replica_mark_unhealthy(replica=replica, message=f"HTTP {status}: {message}")
    return RouteError(502, "BAD_GATEWAY", f"Replica {replica.number} failed the request: {message}")


def route_start(*, endpoint: Endpoint, body: dict, chat: bool) -> str:
    """Checks every request passes before a replica sees it; returns the replica's path."""
    request_check(body, chat=chat, endpoint=endpoint)
    if endpoint.state == EndpointState.DELETING:
        raise RouteError(409, "FAILED_PRECONDITION", f"Endpoint {endpoint.pk} is being deleted.")
    return "/v1/chat/completions" if chat else "/v1/completions"


def completion_route(*, endpoint: Endpoint, body: dict, chat: bool) -> Routed:
    """Answer one request through a replica. Raises RouteError."""

    def forward(replica: Replica, path: str, payload: bytes, started: float) -> Routed:
        return _forward(endpoint, replica, path, payload)

    answer, tried = replicas_try(endpoint=endpoint, body=body, chat=chat, forward=forward)
    answer.attempts = tried
    return answer


def replicas_try(
    *,
    endpoint: Endpoint,
    body: dict,
    chat: bool,
    forward: Callable[[Replica, str, bytes, float], T],
    hands_off: bool = False,
) -> tuple[T, list[str]]:
    """The one retry loop of every completion: ``forward(replica, path, payload, started)``
    on the healthy replicas in turn, the next one when a replica cannot be reached
    (ReplicaUnreachable), a 504 when it does not answer in time; returns what forward
    returned and the replicas tried before. Each attempt is counted in flight on its
    replica and the request's outcome recorded, except where ``hands_off``: then what
    forward returned (a stream's relay) ends the count and records the outcome itself."""
    path = route_start(endpoint=endpoint, body=body, chat=chat)
    payload = json.dumps(body).encode()
    started = time.monotonic()
    status, replica_number = 503, None
    tried: list[str] = []
    try:
        for replica in candidates(endpoint)[:MAX_ATTEMPTS]:
            replica_number = replica.number
            traffic.request_begin(endpoint.pk, replica.number)
            in_flight_here = True
            try:
                result = forward(replica, path, payload, started)
                status, in_flight_here = (0, False) if hands_off else (200, True)
                return result, tried
            except ReplicaUnreachable as exc:
                tried.append(f"replica {replica.number}: {exc}")
                replica_mark_unhealthy(replica=replica, message=f"unreachable: {exc}")
                continue
            except ReplicaTimeout as exc:
                status = 504
                message = f"Replica {replica.number}: {exc}"
                raise RouteError(504, "DEADLINE_EXCEEDED", message) from exc
            except RouteError as exc:
                status = exc.status
                raise
            finally:
                if in_flight_here:
                    traffic.request_done(endpoint.pk, replica.number)
        why = "; ".join(tried) if tried else no_replica_reason(endpoint)
        message = f"Endpoint {endpoint.pk} has no healthy replica: {why}"
        raise RouteError(503, "UNAVAILABLE", message)
    finally:
        if status:
            traffic.request_record(
                endpoint.pk,
                replica_number,
                at=time.time(),
                latency_ms=(time.monotonic() - started) * 1000,
                status=status,
            )


def no_replica_reason(endpoint: Endpoint) -> str:
    states = list(endpoint.replicas.values_list("state", flat=True))
    starting = states.count(ReplicaState.STARTING)
    unhealthy = states.count(ReplicaState.UNHEALTHY)
    if endpoint.state == EndpointState.FAILED:
        return endpoint.status_message or "its replicas keep failing"
    if starting or unhealthy:
        return f"{starting} starting, {unhealthy} unhealthy; try again in a few seconds"
    return "none is running"
