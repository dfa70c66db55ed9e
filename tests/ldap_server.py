"""A private OpenLDAP slapd for the tests: Debian's daemon on a free port, its own
config and data under a temp dir, the test directory (tests/fixtures/ldap/) loaded
with ldapadd, stopped by its pid. Only the tests that ask for the `slapd` fixture
start it (tests/identity/conftest.py).

Every run gets its own name prefix and uidNumber block, derived from the run's temp
dir, so that the local accounts the `ldap` source makes (useradd with the directory's
uid) never meet another test run's on this host; `local_accounts_remove` deletes them.
"""

from __future__ import annotations

import grp
import os
import pwd
import secrets
import subprocess
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

from mtc.devstack import free_port, wait_for

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "ldap"
SUFFIX = "dc=mtc,dc=test"
PEOPLE = f"ou=people,{SUFFIX}"
READER_DN = f"cn=mtc-reader,{SUFFIX}"
ADMIN_DN = f"cn=admin,{SUFFIX}"
PEOPLE_NAMES = ("alice", "bob", "carol")


# `make test`'s lanes that run side by side (scripts/test.sh sets MTC_TEST_LANE): each
# draws its directory's uids from its own third of 31000-58899.
LANES = ("", "db", "postgres")


def run_block(seed: str) -> tuple[str, int]:
    """(name prefix, first uidNumber) for this run: a block of 100 in its lane's third,
    so the lanes of one run never share a block."""
    crc = zlib.crc32(seed.encode())
    third = LANES.index(os.environ.get("MTC_TEST_LANE", "")) * 9300
    return f"l{crc & 0xFFFF:04x}", 31000 + third + (crc >> 16) % 93 * 100


@dataclass
class Slapd:
    root: Path  # config, data, pid file and log live here
    seed: str = ""
    port: int = 0
    uri: str = ""
    prefix: str = ""
    uid_base: int = 0
    passwords: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        self.prefix, self.uid_base = run_block(self.seed or str(self.root))
        self.reader_password = secrets.token_urlsafe(12)
        self.admin_password = secrets.token_urlsafe(12)
        self.passwords = {name: f"{name}-{secrets.token_urlsafe(9)}" for name in PEOPLE_NAMES}
        self.home_root = self.root / "home"

    # What the tests ask about.
    def username(self, person: str) -> str:
        return self.prefix + person

    def uid(self, person: str) -> int:
        return {"alice": self.uid_base + 1, "bob": self.uid_base + 2}[person]

    @property
    def gid(self) -> int:
        return self.uid_base + 50

    def settings(self) -> dict[str, object]:
        """The MTC_LDAP_* settings that point mtc at this directory."""
        return {
            "MTC_LDAP_URI": self.uri,
            "MTC_LDAP_BIND_DN": READER_DN,
            "MTC_LDAP_BIND_PASSWORD": self.reader_password,
            "MTC_LDAP_USER_BASE": PEOPLE,
            "MTC_LDAP_USER_FILTER": "(uid=%(user)s)",
        }

    # Lifecycle.
    def start(self) -> Slapd:
        run_dir = self.root / "slapd"
        (run_dir / "data").mkdir(parents=True, exist_ok=True)
        conf = Template((FIXTURES / "slapd.conf").read_text()).substitute(
            run_dir=run_dir, admin_password=self.admin_password
        )
        (run_dir / "slapd.conf").write_text(conf)
        (run_dir / "slapd.conf").chmod(0o600)
        for _ in range(5):  # a free port can be taken between the probe and slapd's bind
            self.port = free_port()
            self.uri = f"ldap://127.0.0.1:{self.port}/"
            log = open(run_dir / "slapd.log", "ab")  # noqa: SIM115 - slapd keeps it open
            # -d keeps slapd in the foreground, so the pid we hold is the daemon's.
            self.proc = subprocess.Popen(
                ["slapd", "-d", "0", "-h", self.uri, "-f", str(run_dir / "slapd.conf")],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            log.close()
            try:
                wait_for(lambda: self._answers() or self.proc.poll() is not None, 20, "slapd")
            except RuntimeError:
                self.stop()
                raise
            if self.proc.poll() is None:
                break
        else:
            raise RuntimeError(f"slapd did not start: {(run_dir / 'slapd.log').read_text()}")
        self._load()
        return self

    def _answers(self) -> bool:
        return (
            subprocess.run(
                ["ldapwhoami", "-x", "-H", self.uri, "-D", ADMIN_DN, "-w", self.admin_password],
                capture_output=True,
                timeout=10,
            ).returncode
            == 0
        )

    def _hash(self, password: str) -> str:
        out = subprocess.run(
            ["slappasswd", "-h", "{SSHA}", "-s", password],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
        return out.stdout.strip()

    def _load(self) -> None:
        fields = {
            "prefix": self.prefix,
            "home_root": str(self.home_root),
            "alice_uid": self.uid("alice"),
            "bob_uid": self.uid("bob"),
            "research_gid": self.gid,
            "reader_password": self._hash(self.reader_password),
        }
        fields.update({f"{p}_password": self._hash(pw) for p, pw in self.passwords.items()})
        ldif = Template((FIXTURES / "directory.ldif").read_text()).substitute(fields)
        subprocess.run(
            ["ldapadd", "-x", "-H", self.uri, "-D", ADMIN_DN, "-w", self.admin_password],
            input=ldif,
            text=True,
            capture_output=True,
            check=True,
            timeout=30,
        )

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def local_accounts_remove(self) -> None:
        """userdel the local accounts made for this run's directory people (and their groups)."""
        for person in PEOPLE_NAMES:
            name = self.username(person)
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                continue
            if entry.pw_uid < self.uid_base or entry.pw_uid >= self.uid_base + 100:
                continue  # not ours: never touch an account outside this run's block
            subprocess.run(["userdel", name], capture_output=True, timeout=30)
        for group in (self.username("research"), *(self.username(p) for p in PEOPLE_NAMES)):
            if _group_gid(group) in range(self.uid_base, self.uid_base + 100):
                subprocess.run(["groupdel", group], capture_output=True, timeout=30)


def _group_gid(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return -1


def env_seed() -> str:
    """The run's temp dir (scripts/test.sh gives every run its own MTC_DATA_DIR)."""
    return os.environ.get("MTC_DATA_DIR", "") or str(os.getpid())
