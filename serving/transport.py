"""The one way mtc talks to replicas: HTTP/1.1 with kept-alive connections per thread
(the router calls the same few replicas over and over) and a bearer token. On this
host, a new connection is used only once the socket that accepted it is the replica
owner's (mtc.loopback): a job that took a dead replica's port gets neither the token
nor the traffic."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from mtc.loopback import check_peer

CONNECT_TIMEOUT_S = 2.0
_local = threading.local()


class ReplicaUnreachable(Exception):
    """No answer at all: refused, reset, closed. The replica is probably gone."""


class ReplicaTimeout(Exception):
    """Connected, but no answer in time (busy, or stuck)."""


@dataclass
class ReplicaResponse:
    status: int
    body: bytes


def _pool() -> dict[tuple[str, int], http.client.HTTPConnection]:
    if not hasattr(_local, "connections"):
        _local.connections = {}
    return _local.connections


def _drop(key: tuple[str, int]) -> None:
    conn = _pool().pop(key, None)
    if conn is not None:
        conn.close()


def _connect(host: str, port: int, owner_uid: int | None) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection(host, port, timeout=CONNECT_TIMEOUT_S)
    try:
        conn.connect()
        check_peer(conn.sock, owner_uid, f"{host}:{port}")
    except OSError as exc:  # refused, unreachable, no answer to the SYN, not the owner's
        conn.close()
        raise ReplicaUnreachable(f"{host}:{port}: {exc or type(exc).__name__}") from exc
    return conn


def replica_call(
    host: str,
    port: int,
    method: str,
    path: str,
    *,
    token: str,
    body: bytes | None = None,
    timeout: float,
    owner_uid: int | None = None,
) -> ReplicaResponse:
    """``owner_uid``: the account the replica runs as (checked on a loopback connection
    before anything is sent; None: nothing to check, a node elsewhere)."""
    key = (host, port)
    for attempt in (1, 2):
        conn = _pool().get(key)
        if conn is not None and conn.sock is None:  # closed since: dial again
            _drop(key)
            conn = None
        reused = conn is not None
        if conn is None:
            conn = _connect(host, port, owner_uid)
            _pool()[key] = conn
        try:
            conn.sock.settimeout(timeout)
            headers = {"Authorization": f"Bearer {token}"}
            if body is not None:
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
        except TimeoutError as exc:
            _drop(key)
            raise ReplicaTimeout(f"{host}:{port} gave no answer within {timeout:g} s") from exc
        except (OSError, http.client.HTTPException) as exc:
            _drop(key)
            if reused and attempt == 1:
                continue  # a kept-alive connection the replica had closed: dial again
            raise ReplicaUnreachable(f"{host}:{port}: {exc or type(exc).__name__}") from exc
        if response.will_close:
            _drop(key)
        return ReplicaResponse(response.status, data)
    raise AssertionError("not reached: the second attempt returns or raises")


class ReplicaStream:
    """A replica's answer to a streaming request: its status, and for a 200 its
    server-sent events one at a time as they arrive. Owns its connection."""

    def __init__(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse):
        self.conn, self.response, self.status = conn, response, response.status

    def read_body(self) -> bytes:
        """The whole body, for an answer that is not a stream (an error)."""
        try:
            return self.response.read()
        finally:
            self.close()

    def events(self) -> Iterator[bytes]:
        """Each event as ``data: ...\\n\\n``; raises ReplicaUnreachable or ReplicaTimeout
        when the replica stops midway (never half an event)."""
        lines: list[bytes] = []
        host, port = self.conn.host, self.conn.port
        try:
            while True:
                line = self.response.readline()
                if not line:
                    if lines:
                        raise ReplicaUnreachable(f"{host}:{port} ended the stream mid-event")
                    return
                if line in (b"\n", b"\r\n"):
                    if lines:
                        yield b"".join(lines) + b"\n"
                        lines = []
                    continue
                lines.append(line if line.endswith(b"\n") else line + b"\n")
        except TimeoutError as exc:
            raise ReplicaTimeout(f"{host}:{port} sent nothing for too long") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise ReplicaUnreachable(f"{host}:{port}: {exc or type(exc).__name__}") from exc

    def close(self) -> None:
        self.conn.close()  # a half-read stream cannot be reused: the replica sees it go


def replica_stream(
    host: str,
    port: int,
    path: str,
    *,
    token: str,
    body: bytes,
    timeout: float,
    owner_uid: int | None = None,
) -> ReplicaStream:
    """POST a streaming request on a connection of its own (the kept-alive ones serve
    whole answers; this one stays busy for as long as the stream lasts). ``timeout``
    bounds the wait for the headers and then for each event."""
    conn = _connect(host, port, owner_uid)
    try:
        conn.sock.settimeout(timeout)
        headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
        }
        conn.request("POST", path, body=body, headers=headers)
        return ReplicaStream(conn, conn.getresponse())
    except TimeoutError as exc:
        conn.close()
        raise ReplicaTimeout(f"{host}:{port} gave no answer within {timeout:g} s") from exc
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        raise ReplicaUnreachable(f"{host}:{port}: {exc or type(exc).__name__}") from exc
