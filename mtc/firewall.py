"""An nftables table of mtc's own that keeps jobs off mtc's listeners on this host.

Local clusters' jobs run on mtc's host as their owners' accounts, and a process of any
account may connect to any port on it: Redis (Celery's queues, the caches), PostgreSQL,
MariaDB, the web server. The table refuses TCP connections from the accounts mtc makes
(``MTC_UID_RANGE``, plus ``MTC_FIREWALL_UIDS`` for a directory's accounts) to a set of
mtc's ports on this host's addresses (``fib daddr type local``); everything else (jobs
talking to each other over loopback, to slurmctld, slurmd and slurmdbd, to the outside)
is untouched. Not a network namespace per job: local multi-node jobs talk over 127.0.0.1.

One table per installation (``mtc_<digest of the data dir>``, or ``MTC_FIREWALL``: `make
test` names one for all its lanes), so `make run` and a test run on one host keep their
own; made at start (`make run`: ``manage.py mtc firewall up``), removed at stop. Without
nft or the privilege to use it, nothing is made and the caller says so. No Django here."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

UID_RANGE_RE = re.compile(r"\s*([0-9]+)\s*-\s*([0-9]+)\s*")


TABLE_RE = re.compile(r"mtc_[a-z0-9_]{1,40}")


def table_for(data_dir: Path | str) -> str:
    """The table of the installation whose data dir this is (``MTC_FIREWALL`` wins)."""
    named = os.environ.get("MTC_FIREWALL", "")
    if TABLE_RE.fullmatch(named):
        return named
    digest = hashlib.sha1(str(Path(data_dir).resolve()).encode()).hexdigest()[:10]
    return f"mtc_{digest}"


def uid_ranges(*specs: str) -> list[tuple[int, int]]:
    """``"20000-29999"`` and ``"30000-30099,40000-40010"`` -> [(low, high), ...]."""
    ranges = []
    for spec in specs:
        for part in filter(None, (p.strip() for p in (spec or "").split(","))):
            match = UID_RANGE_RE.fullmatch(part)
            if not match or int(match[1]) > int(match[2]) or int(match[1]) < 1:
                raise ValueError(f"not a uid range: {part!r}")
            ranges.append((int(match[1]), int(match[2])))
    return ranges


def _nft(script: str | None, *args: str) -> subprocess.CompletedProcess:
    argv = ["nft", *args] if script is None else ["nft", "-f", "-"]
    return subprocess.run(argv, input=script, capture_output=True, text=True, timeout=20)


def firewall_problem() -> str | None:
    """Why no table can be made here, or None."""
    if not shutil.which("nft"):
        return "nft is not installed (Debian's nftables package)"
    probe = _nft(None, "list", "tables")
    if probe.returncode != 0:
        return f"nft cannot be used here: {probe.stderr.strip() or probe.stdout.strip()}"
    return None


def firewall_apply(table: str, *, uids: list[tuple[int, int]], ports: list[int]) -> str | None:
    """Make (or make again) the table; returns why not, or None."""
    if not TABLE_RE.fullmatch(table):
        raise ValueError(f"not a table name of mtc's: {table!r}")
    problem = firewall_problem()
    if problem:
        return problem
    if not uids:
        return "no uid range to keep off mtc's ports"
    name = table
    uid_elements = ", ".join(f"{low}-{high}" if low != high else str(low) for low, high in uids)
    port_elements = ", ".join(str(p) for p in sorted(set(ports)))
    ports_set = f"elements = {{ {port_elements} }}" if port_elements else ""
    script = "\n".join(
        [
            f"table inet {name}",
            f"delete table inet {name}",
            f"table inet {name} {{",
            f"  set uids {{ type uid; flags interval; elements = {{ {uid_elements} }}; }}",
            f"  set ports {{ type inet_service; {ports_set} }}",
            "  chain out {",
            "    type filter hook output priority 0; policy accept;",
            "    meta skuid @uids fib daddr type local tcp dport @ports reject with tcp reset",
            "  }",
            "}",
            "",
        ]
    )
    done = _nft(script)
    if done.returncode != 0:
        return f"nft refused the table: {done.stderr.strip()}"
    return None


def firewall_ports_add(table: str, ports: list[int]) -> bool:
    """Add listeners to the table (a web server started later); False when it has none."""
    if not ports or not shutil.which("nft") or not TABLE_RE.fullmatch(table):
        return False
    elements = ", ".join(str(int(p)) for p in ports)
    done = _nft(None, "add", "element", "inet", table, "ports", f"{{ {elements} }}")
    return done.returncode == 0


def firewall_ports_remove(table: str, ports: list[int]) -> None:
    """A listener gone (a TensorBoard stopped): its port is anyone's again."""
    for port in ports:
        if shutil.which("nft") and TABLE_RE.fullmatch(table):
            _nft(None, "delete", "element", "inet", table, "ports", f"{{ {int(port)} }}")


def firewall_ports(table: str) -> set[int]:
    """The ports the table keeps jobs off (empty without one)."""
    if not shutil.which("nft") or not TABLE_RE.fullmatch(table):
        return set()
    done = _nft(None, "list", "set", "inet", table, "ports")
    if done.returncode != 0:
        return set()
    match = re.search(r"elements = \{([^}]*)\}", done.stdout)
    return {int(p) for p in re.findall(r"[0-9]+", match[1])} if match else set()


def firewall_remove(table: str) -> None:
    if shutil.which("nft") and TABLE_RE.fullmatch(table):
        _nft(None, "delete", "table", "inet", table)


def main(argv: list[str]) -> int:
    """``python -m mtc.firewall apply TABLE UIDS PORT...`` | ``remove TABLE``
    (scripts/test.sh). Prints why not when no table is made; exits 0 either way."""
    if len(argv) >= 3 and argv[0] == "apply":
        ports = [int(p) for p in argv[3:]]
        why = firewall_apply(argv[1], uids=uid_ranges(argv[2]), ports=ports)
        print(say(why, argv[2], ports))
        return 0
    if len(argv) == 2 and argv[0] == "remove":
        firewall_remove(argv[1])
        return 0
    print("usage: python -m mtc.firewall apply TABLE UIDS PORT... | remove TABLE")
    return 2


def say(why: str | None, uids: str, ports: list[int]) -> str:
    """The start-up line: what is kept off what, or that nothing is."""
    if why is None:
        listed = " ".join(str(p) for p in sorted(set(ports)))
        return f"firewall: accounts {uids} kept off mtc's ports {listed}"
    return f"firewall: none ({why}); jobs can reach mtc's listeners on this host"


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
