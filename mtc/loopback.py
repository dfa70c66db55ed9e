"""Who answers a loopback connection: the uid of the process whose socket accepted it,
from the kernel's socket table (/proc/net/tcp, tcp6). mtc calls ports on this host that
a user's process opened (a replica, a TensorBoard); any process may take a port that
was freed, so before mtc sends a token or a person's request there it checks that the
answering socket is the owner's. No Django here."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def _proc_address(host: str, port: int) -> str:
    """An address as /proc/net/tcp writes it: the address's 32-bit words in host order
    (little-endian here) as hex, a colon, the port as 4 hex digits."""
    packed = ipaddress.ip_address(host).packed
    words = [packed[i : i + 4][::-1].hex().upper() for i in range(0, len(packed), 4)]
    return f"{''.join(words)}:{port:04X}"


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the socket at the other end of a connected loopback ``sock`` (None
    when it is not found: not loopback, or gone)."""
    try:
        mine = sock.getsockname()[:2]
        theirs = sock.getpeername()[:2]
    except OSError:
        return None
    if not ipaddress.ip_address(theirs[0]).is_loopback:
        return None
    local, remote = _proc_address(*theirs), _proc_address(*mine)
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 7 and fields[1] == local and fields[2] == remote:
                return int(fields[7])
    return None


class NotTheOwner(OSError):
    """The port is answered by another account's process than the one mtc expects."""


def check_peer(sock: socket.socket, expected_uid: int | None, what: str) -> None:
    """Raise NotTheOwner unless the loopback peer of ``sock`` runs as ``expected_uid``
    (None: nothing to check, as for a node elsewhere)."""
    if expected_uid is None:
        return
    try:
        if not ipaddress.ip_address(sock.getpeername()[0]).is_loopback:
            return
    except (OSError, ValueError):
        return
    uid = peer_uid(sock)
    if uid != expected_uid:
        raise NotTheOwner(f"{what} is answered by uid {uid}, not {expected_uid}: not sent")
