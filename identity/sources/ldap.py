"""The `ldap` identity source: a person's posixAccount entry in the directory
(uid, uidNumber, gidNumber, homeDirectory) is their POSIX identity.

Sign-in is django-auth-ldap (identity/ldap_backend.py); this module reads the entry
with mtc's own bind (MTC_LDAP_BIND_DN), so it also works for a session whose
password mtc no longer holds.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import subprocess

import ldap
from django.conf import settings
from ldap.dn import explode_dn
from ldap.filter import escape_filter_chars

from identity.ldap_backend import connection_options
from identity.sources.base import AccountData, IdentityMissing
from mtc import userfs

POSIX_ATTRS = ("uidNumber", "gidNumber", "homeDirectory")
POSIX_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


class DirectoryUnavailable(Exception):
    """The directory did not answer or refused mtc's bind (a site problem, not the user's)."""


def _where(dn: str) -> str:
    """'uid=carol in ou=people,dc=example,dc=org' for messages people can act on."""
    parts = explode_dn(dn)
    return f"{parts[0]} in {','.join(parts[1:])}" if len(parts) > 1 else dn


def _search(username: str) -> list[tuple[str, dict[str, list[bytes]]]]:
    conn = ldap.initialize(settings.MTC_LDAP_URI)
    for option, value in connection_options().items():
        conn.set_option(option, value)
    try:
        conn.simple_bind_s(settings.MTC_LDAP_BIND_DN, settings.MTC_LDAP_BIND_PASSWORD)
        found = conn.search_s(
            settings.MTC_LDAP_USER_BASE,
            ldap.SCOPE_SUBTREE,
            settings.MTC_LDAP_USER_FILTER % {"user": escape_filter_chars(username)},
            ["objectClass", "uid", *POSIX_ATTRS],
        )
    except ldap.NO_SUCH_OBJECT:
        return []
    except ldap.LDAPError as exc:
        raise DirectoryUnavailable(f"the directory at {settings.MTC_LDAP_URI}: {exc}") from exc
    finally:
        conn.unbind_s()
    return [(dn, attrs) for dn, attrs in found if dn]  # dn None: a search reference


def _first(attrs: dict[str, list[bytes]], name: str) -> str:
    return attrs[name][0].decode()


def account_data(user) -> AccountData:
    """The user's posixAccount from the directory; IdentityMissing names what is missing."""
    base = settings.MTC_LDAP_USER_BASE
    entries = _search(user.get_username())
    if not entries:
        raise IdentityMissing(f"no directory entry for uid={user.get_username()} in {base}")
    if len(entries) > 1:
        raise IdentityMissing(
            f"{len(entries)} directory entries match {user.get_username()} in {base}"
        )
    dn, attrs = entries[0]
    classes = {value.decode().lower() for value in attrs.get("objectClass", [])}
    missing = [name for name in POSIX_ATTRS if not attrs.get(name)]
    if "posixaccount" not in classes or missing:
        raise IdentityMissing(
            f"no posixAccount ({', '.join(missing or POSIX_ATTRS)}) for {_where(dn)}"
        )
    name = _first(attrs, "uid") if attrs.get("uid") else user.get_username()
    if not POSIX_NAME.fullmatch(name):
        raise IdentityMissing(f"uid {name!r} of {_where(dn)} is not a valid POSIX user name")
    try:
        uid, gid = int(_first(attrs, "uidNumber")), int(_first(attrs, "gidNumber"))
    except ValueError as exc:
        raise IdentityMissing(f"uidNumber or gidNumber of {_where(dn)} is not a number") from exc
    if uid <= 0 or gid <= 0:
        raise IdentityMissing(f"{_where(dn)} has uidNumber {uid}, gidNumber {gid}: root's")
    return AccountData(name=name, uid=uid, gid=gid, home=_first(attrs, "homeDirectory"))


def account_materialise(data: AccountData) -> None:
    """Make the directory's account exist on this host with the directory's uid and gid.

    Why: Slurm runs a job as a uid, and slurmd resolves it (getpwuid) before it starts the
    job. A real site's nodes resolve directory users through nss-ldap or sssd; mtc's
    local provider runs every node's slurmd on this one machine, which has no such NSS
    module, so the account is written into /etc/passwd here (useradd, as the `local`
    source does, but with the directory's numbers, never numbers of mtc's choosing).
    An existing account that disagrees with the directory is refused, never changed.
    """
    _check_existing(data)
    try:
        grp.getgrgid(data.gid)
    except KeyError:
        group = data.name if not _group_exists(data.name) else f"g{data.gid}"
        _run(["groupadd", "-g", str(data.gid), group], ok_if=lambda: _gid_exists(data.gid))
    try:
        pwd.getpwuid(data.uid)
    except KeyError:
        _run(
            [
                "useradd",
                "-u",
                str(data.uid),
                "-g",
                str(data.gid),
                "-d",
                data.home,
                "-M",
                "-s",
                "/bin/bash",
                "-c",
                "mtc, from the directory",
                data.name,
            ],  # fmt: skip
            ok_if=lambda: _check_existing(data) or _uid_exists(data.uid),
        )
    if not os.path.isdir(data.home):
        # Sites mount homes (NFS, autofs); here the job's working directory must exist.
        os.makedirs(os.path.dirname(data.home) or "/", exist_ok=True)
        userfs.dir_own(data.home, data)


def _check_existing(data: AccountData) -> None:
    for lookup, key in ((pwd.getpwuid, data.uid), (pwd.getpwnam, data.name)):
        try:
            entry = lookup(key)
        except KeyError:
            continue
        if (entry.pw_name, entry.pw_uid, entry.pw_gid) != (data.name, data.uid, data.gid):
            raise IdentityMissing(
                f"the directory gives {data.name} uid {data.uid} gid {data.gid}, but this host "
                f"has {entry.pw_name} with uid {entry.pw_uid} gid {entry.pw_gid}"
            )


def _uid_exists(uid: int) -> bool:
    try:
        return bool(pwd.getpwuid(uid))
    except KeyError:
        return False


def _gid_exists(gid: int) -> bool:
    try:
        return bool(grp.getgrgid(gid))
    except KeyError:
        return False


def _group_exists(name: str) -> bool:
    try:
        return bool(grp.getgrnam(name))
    except KeyError:
        return False


def _run(argv: list[str], *, ok_if) -> None:
    """Run useradd/groupadd; another worker making the same account at once is fine."""
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if result.returncode != 0 and not ok_if():
        raise IdentityMissing(f"{argv[0]} {argv[-1]} failed: {result.stderr.strip()}")
