"""Who a Compute Engine node lets in and what it may reach: the cluster's users'
POSIX accounts (the same names, uids and gids on every node as in mtc's database),
the VM's service account and its scopes, and the rule that keeps every process but
root away from the metadata server (where the munge key and the VM's access token
are). Pure, except ``node_accounts``, which reads the database."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from identity.sources.base import AccountData

# The metadata server, by address and by name (scripts/block.sh resolves the name too).
METADATA_ADDRESS = "169.254.169.254"
METADATA_HOST = "metadata.google.internal"
DEFAULT_SERVICE_ACCOUNT = "mtc-nodes@{project}.iam.gserviceaccount.com"
# Nodes only write logs and metrics (the ops agent, DCGM metrics); never cloud-platform.
BASE_SCOPES = (
    "https://www.googleapis.com/auth/logging.write",
    "https://www.googleapis.com/auth/monitoring.write",
)
# gcsfuse mounts read and write the spec's buckets as the VM's service account.
STORAGE_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
ACCOUNTS_KEY = "mtc-accounts"

# What scripts/accounts_parse.py accepts too: a node checks again what mtc rendered.
POSIX_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
MIN_ID, MAX_ID = 1000, 2**31 - 2  # never root, never a system account
SAFE_HOME = re.compile(r"^/[A-Za-z0-9._/-]*$")


class BadAccount(ValueError):
    pass


def check_account(account: AccountData) -> AccountData:
    """Refuse an account a node could not (or must not) create."""
    if not POSIX_NAME.fullmatch(account.name):
        raise BadAccount(f"account name {account.name!r} is not a POSIX user name")
    for what, value in (("uid", account.uid), ("gid", account.gid)):
        if not isinstance(value, int) or not MIN_ID <= value <= MAX_ID:
            raise BadAccount(f"{account.name}: {what} {value!r} is outside {MIN_ID}-{MAX_ID}")
    if not SAFE_HOME.fullmatch(account.home) or "/../" in f"{account.home}/":
        raise BadAccount(f"{account.name}: home {account.home!r} is not a plain absolute path")
    return account


def accounts_json(accounts: Iterable[AccountData]) -> str:
    """The ``mtc-accounts`` metadata value: one JSON object per line, sorted by uid, so
    the plan prints it as a file people can read."""
    rows = sorted({check_account(a) for a in accounts}, key=lambda a: (a.uid, a.name))
    names = [a.name for a in rows]
    uids = [a.uid for a in rows]
    if len(set(names)) != len(names) or len(set(uids)) != len(uids):
        raise BadAccount("two accounts share a name or a uid")
    lines = [json.dumps({"name": a.name, "uid": a.uid, "gid": a.gid, "home": a.home}) for a in rows]
    return "[\n" + ",\n".join(lines) + "\n]\n"


def node_home(home: str, name: str, data_dir: str) -> str:
    """Where an account's home is on the nodes: the account's own home, unless that is
    a path on mtc's host (local mode keeps homes under the data dir), then /home/<name>
    (the spec's Filestore share when it has one)."""
    data = str(Path(data_dir).resolve())
    if home == data or home.startswith(data.rstrip("/") + "/"):
        return f"/home/{name}"
    return home


def node_accounts() -> list[AccountData]:
    """Every mtc user's POSIX account, as the nodes must have it. Empty until the
    identity app (its PosixAccount model) is installed."""
    from django.apps import apps
    from django.conf import settings

    if not apps.is_installed("identity"):
        return []
    from identity.models import PosixAccount

    out: dict[str, AccountData] = {}
    for row in PosixAccount.objects.order_by("uid", "name"):
        # In single-user mode every user maps to mtc's one account: render it once.
        out.setdefault(
            row.name,
            AccountData(
                name=row.name,
                uid=row.uid,
                gid=row.gid,
                home=node_home(row.home, row.name, str(settings.DATA_DIR)),
            ),
        )
    return list(out.values())


def service_account(template: str, project: str) -> str:
    return (template or DEFAULT_SERVICE_ACCOUNT).replace("{project}", project)


def node_scopes(spec: dict) -> list[str]:
    """Only what nodes need: logs and metrics, and storage where the spec mounts buckets."""
    scopes = list(BASE_SCOPES)
    if (spec.get("storage") or {}).get("gcs_fuse"):
        scopes.append(STORAGE_SCOPE)
    return scopes
