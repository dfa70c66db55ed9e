"""Slurm accounts, users and their limits in slurmdbd, through `sacctmgr` (argument
lists, `--immediate` for writes, `--parsable2` for reads). Every call names the
cluster: associations are per cluster, and one slurmdbd serves several."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .client import SlurmClient
from .errors import TRANSIENT_MARKERS, SlurmError

NAME_RE = re.compile(r"[a-z][a-z0-9_-]{0,39}")  # accounts and QoS (sacctmgr lower-cases)
USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")  # POSIX (portable) user names
CLUSTER_RE = re.compile(r"[A-Za-z0-9_]{1,40}")
# gres/gpu=16, cpu=64,gres/gpu=8 ... ("-1" clears a limit)
TRES_RE = re.compile(r"(cpu|mem|node|billing|gres/gpu(:[a-z0-9]+)?)=(-1|[0-9]{1,12})")
TRES_LIST_RE = re.compile(rf"{TRES_RE.pattern}(,{TRES_RE.pattern})*")
# sacctmgr's answers when there was nothing to do: idempotent writes accept them.
NOTHING = ("nothing new added", "already exists", "nothing modified", "nothing deleted")


@dataclass(frozen=True)
class Limits:
    """An account's limits as sacctmgr takes them ("" leaves one unset)."""

    shares: int | None = None
    qos: str = ""  # comma-separated QoS names the account may use
    grp_tres: str = ""  # e.g. gres/gpu=16: all the account's running jobs together
    grp_tres_mins: str = ""  # e.g. gres/gpu=6000: a budget of GPU-minutes
    max_tres_per_user: str = ""  # each user's association under the account

    def account_args(self, *, clear: bool = False) -> list[str]:
        """Key=value pairs for the account's own association; clear=True also
        writes unset limits as -1 (a PATCH that removes one)."""
        args = []
        if self.shares is not None:
            args.append(f"Fairshare={self.shares}")
        if self.qos:
            args.append(f"QOS={self.qos}")
        for key, value in (("GrpTRES", self.grp_tres), ("GrpTRESMins", self.grp_tres_mins)):
            if value:
                args.append(f"{key}={value}")
            elif clear:
                args.append(f"{key}=gres/gpu=-1")
        return args

    def user_args(self) -> list[str]:
        return [f"GrpTRES={self.max_tres_per_user or 'gres/gpu=-1'}"]


@dataclass(frozen=True)
class Association:
    cluster: str
    account: str
    user: str  # "" for the account's own association
    shares: str
    grp_tres: str
    grp_tres_mins: str
    qos: str


def _check(value: str, pattern: re.Pattern, what: str) -> str:
    if not pattern.fullmatch(value):
        raise SlurmError(f"invalid {what} {value!r}", permanent=True)
    return value


def _write(client: SlurmClient, args: list[str]) -> None:
    proc = client.run(["sacctmgr", "--immediate", *args], check=False, timeout=30)
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0 and not any(n in text.lower() for n in NOTHING):
        transient = any(m in text.lower() for m in TRANSIENT_MARKERS)
        message = text or f"sacctmgr exited {proc.returncode}"
        raise SlurmError(message, permanent=not transient, command=proc.args)


def qos_ensure(client: SlurmClient, name: str) -> None:
    _write(client, ["add", "qos", _check(name, NAME_RE, "QoS name")])


def account_add(client: SlurmClient, *, cluster: str, name: str, limits: Limits) -> None:
    """Make the account on the cluster (an existing one gets the limits)."""
    _check(cluster, CLUSTER_RE, "cluster name")
    _check(name, NAME_RE, "account name")
    for qos in filter(None, limits.qos.split(",")):
        qos_ensure(client, qos)
    _write(client, ["add", "account", name, f"Cluster={cluster}", *limits.account_args()])
    account_modify(client, cluster=cluster, name=name, limits=limits)


def account_modify(client: SlurmClient, *, cluster: str, name: str, limits: Limits) -> None:
    _check(cluster, CLUSTER_RE, "cluster name")
    _check(name, NAME_RE, "account name")
    for qos in filter(None, limits.qos.split(",")):
        qos_ensure(client, qos)
    where = ["where", f"Name={name}", f"Cluster={cluster}"]
    _write(client, ["modify", "account", *where, "set", *limits.account_args(clear=True)])
    users = ["where", f"Account={name}", f"Cluster={cluster}"]
    _write(client, ["modify", "user", *users, "set", *limits.user_args()])


def account_delete(client: SlurmClient, *, cluster: str, name: str) -> None:
    _check(cluster, CLUSTER_RE, "cluster name")
    _check(name, NAME_RE, "account name")
    _write(client, ["delete", "account", "where", f"Name={name}", f"Cluster={cluster}"])


def user_add(
    client: SlurmClient, *, cluster: str, user: str, account: str, limits: Limits | None = None
) -> None:
    """The user's association under the account (their default account when they
    had none on the cluster)."""
    _check(cluster, CLUSTER_RE, "cluster name")
    _check(user, USER_RE, "user name")
    _check(account, NAME_RE, "account name")
    _write(client, ["add", "user", user, f"Account={account}", f"Cluster={cluster}"])
    if limits is not None and limits.max_tres_per_user:
        where = ["where", f"Name={user}", f"Account={account}", f"Cluster={cluster}"]
        _write(client, ["modify", "user", *where, "set", *limits.user_args()])


def user_remove(client: SlurmClient, *, cluster: str, user: str, account: str) -> None:
    _check(cluster, CLUSTER_RE, "cluster name")
    _check(user, USER_RE, "user name")
    _check(account, NAME_RE, "account name")
    where = ["where", f"Name={user}", f"Account={account}", f"Cluster={cluster}"]
    _write(client, ["delete", "user", *where])


ASSOC_FORMAT = "Cluster,Account,User,Fairshare,GrpTRES,GrpTRESMins,QOS"


def associations(client: SlurmClient, *, cluster: str) -> list[Association]:
    """Every association of the cluster, from one `sacctmgr show assoc`."""
    _check(cluster, CLUSTER_RE, "cluster name")
    out = client.run(
        [
            "sacctmgr",
            "--parsable2",
            "--noheader",
            "show",
            "assoc",
            "where",
            f"Cluster={cluster}",
            f"format={ASSOC_FORMAT}",
        ],
        timeout=30,
    ).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) == 7:
            rows.append(Association(*parts))
    return rows
