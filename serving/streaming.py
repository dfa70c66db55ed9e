"""Routing one streaming completion: the same checks and replica choice as a whole
answer, then the replica's server-sent events relayed one at a time as they arrive.
Anything that goes wrong before the replica's 200 is a RouteError (mtc's JSON error
shape, and another replica is tried); after it, an error event ends the stream."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

from . import conf, traffic
from .models import Endpoint, Replica
from .routing import replica_refused, replicas_try
from .selectors import replica_owner_uid
from .services import replica_mark_unhealthy
from .transport import ReplicaStream, ReplicaTimeout, ReplicaUnreachable, replica_stream

DONE = b"data: [DONE]\n\n"
CLIENT_GONE = 499  # recorded when the caller hangs up midway (nginx's code for it)


def sse_error(code: str, message: str) -> bytes:
    """mtc's error shape as one event: OpenAI clients raise it as an APIError."""
    body = {"error": {"code": code, "message": message, "fields": {}}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _is_error(event: bytes) -> bool:
    return event.startswith((b'data: {"error"', b'data:{"error"'))


@dataclass
class Streamed:
    events: Iterator[bytes]
    replica_number: int


def completion_stream_route(*, endpoint: Endpoint, body: dict, chat: bool) -> Streamed:
    """Open a stream on a healthy replica. Raises RouteError until one answers 200."""

    def forward(replica: Replica, path: str, payload: bytes, started: float) -> Streamed:
        stream = replica_stream(
            replica.host,
            replica.port,
            path,
            token=endpoint.replica_token,
            body=payload,
            timeout=conf.request_timeout_s(),
            owner_uid=replica_owner_uid(endpoint),
        )
        if stream.status != 200:
            raise replica_refused(replica, stream.status, stream.read_body())
        return Streamed(_relay(endpoint, replica, stream, started), replica.number)

    # The relay counts the request done and records how it ended, once the stream ends.
    streamed, _tried = replicas_try(
        endpoint=endpoint, body=body, chat=chat, forward=forward, hands_off=True
    )
    return streamed


def _relay(
    endpoint: Endpoint, replica: Replica, stream: ReplicaStream, started: float
) -> Iterator[bytes]:
    """The replica's events as they come; a stream that breaks ends with an error event.
    The caller hanging up closes this generator, which hangs up on the replica (and so
    ends its generation)."""
    status = CLIENT_GONE  # until the stream ends one way or another
    try:
        try:
            for event in stream.events():
                if event == DONE:
                    status = 200
                elif _is_error(event):  # the replica's own account of a failure
                    status = 502
                yield event
                if status != CLIENT_GONE:
                    return
        except ReplicaTimeout as exc:
            status = 504
            yield sse_error("DEADLINE_EXCEEDED", f"Replica {replica.number}: {exc}")
            return
        except ReplicaUnreachable as exc:
            status = 502
            replica_mark_unhealthy(replica=replica, message=f"stream broke: {exc}")
            yield sse_error("UNAVAILABLE", f"Replica {replica.number} stopped midway: {exc}")
            return
        status = 502
        yield sse_error("UNAVAILABLE", f"Replica {replica.number} ended the stream early.")
    finally:
        stream.close()
        traffic.request_done(endpoint.pk, replica.number)
        traffic.request_record(
            endpoint.pk,
            replica.number,
            at=time.time(),
            latency_ms=(time.monotonic() - started) * 1000,
            status=status,
        )
