"""local: mtc makes each user's Unix account itself (useradd/groupadd, argument
lists only) in ``MTC_UID_RANGE``; a user's group has the same number as their uid.
Home directories live under ``$MTC_DATA_DIR/home/<name>`` (0700, the account's)."""

from __future__ import annotations

import grp
import hashlib
import logging
import os
import pwd
import re
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from django.conf import settings

from mtc import userfs

from .base import AccountData, IdentityMissing

log = logging.getLogger(__name__)
isolated = True
POSIX_NAME_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
# Names a user must never get, whatever their mtc username.
RESERVED = {"root", "daemon", "bin", "sys", "nobody", "slurm", "munge", "mtc", "admin"}
ATTEMPTS = 20


def uid_range() -> tuple[int, int]:
    raw = str(settings.MTC_UID_RANGE)
    match = re.fullmatch(r"\s*([0-9]+)\s*-\s*([0-9]+)\s*", raw)
    if not match or int(match[1]) < 1000 or int(match[1]) > int(match[2]):
        raise IdentityMissing(f"MTC_UID_RANGE must look like 20000-29999, not {raw!r}")
    return int(match[1]), int(match[2])


def home_root() -> Path:
    root = Path(settings.DATA_DIR) / "home"
    root.mkdir(mode=0o711, exist_ok=True)
    return root


def _name_free(name: str) -> bool:
    for lookup in (pwd.getpwnam, grp.getgrnam):
        try:
            lookup(name)
            return False
        except KeyError:
            pass
    return True


def id_free(number: int) -> bool:
    """Whether no account and no group on this host has this number."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(number)
            return False
        except KeyError:
            pass
    return True


def is_posix_name(username: str) -> bool:
    return bool(POSIX_NAME_RE.fullmatch(username)) and username not in RESERVED


def derived_name(username: str, uid: int) -> str:
    """A safe name from the username's valid characters and the uid (no other
    account has that uid, so no other account has this name)."""
    base = re.sub(r"[^a-z0-9_-]", "", username.lower())
    if not base or not re.match(r"[a-z_]", base):
        base = "u" + base
    return f"{base[:20]}{uid}"


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)


def _locked(proc: subprocess.CompletedProcess) -> bool:
    # useradd/groupadd of another process holds /etc/passwd or /etc/group.
    return "lock" in (proc.stderr or "").lower()


def _add(uid: int, name: str, home: Path, username: str) -> bool:
    """groupadd + useradd; False when the id or name was taken meanwhile."""
    for _ in range(ATTEMPTS):
        proc = _run(["groupadd", "-g", str(uid), name])
        if not _locked(proc):
            break
        time.sleep(0.1)
    if proc.returncode != 0:
        log.info("groupadd %s (%s) failed: %s", name, uid, proc.stderr.strip())
        return False
    args = ["useradd", "-u", str(uid), "-g", str(uid), "-M", "-d", str(home)]
    args += ["-s", "/bin/bash", "-c", _comment(username), name]
    for _ in range(ATTEMPTS):
        proc = _run(args)
        if not _locked(proc):
            break
        time.sleep(0.1)
    if proc.returncode != 0:
        log.info("useradd %s (%s) failed: %s", name, uid, proc.stderr.strip())
        _run(["groupdel", name])
        return False
    return True


def account_create(*, username: str, taken_uids: Iterable[int] = ()) -> AccountData:
    """Make a new Unix account for ``username``; raises IdentityMissing when the
    range is full or the host refuses."""
    if os.geteuid() != 0:
        raise IdentityMissing("local accounts need mtc to run as root")
    low, high = uid_range()
    taken = set(taken_uids)
    adopted = _made_before(username, low, high, taken)
    if adopted is not None:
        _home_make(Path(adopted.home), adopted.uid)
        return adopted
    # Start at a point derived from the name: concurrent creators rarely race.
    span = high - low + 1
    start = int(hashlib.sha1(username.encode()).hexdigest(), 16) % span
    for step in range(span):
        uid = low + (start + step) % span
        if uid in taken or not id_free(uid):
            continue
        name = username if is_posix_name(username) else derived_name(username, uid)
        if not _name_free(name):  # the username is someone else's already
            name = derived_name(username, uid)
            if not _name_free(name):
                continue
        home = home_root() / name
        if not _add(uid, name, home, username):
            continue
        _home_make(home, uid)
        return AccountData(name=name, uid=uid, gid=uid, home=str(home))
    raise IdentityMissing(f"no free uid left in MTC_UID_RANGE {low}-{high}")


def _home_make(home: Path, uid: int) -> None:
    if home.parent != home_root():  # not ours to make (an account of another data dir)
        return
    userfs.dir_own(home, userfs.Ids(uid, uid))


def _comment(username: str) -> str:
    return f"mtc user {username[:64]}"


def _made_before(username: str, low: int, high: int, taken: set[int]) -> AccountData | None:
    """The account mtc made for this username earlier (in its range, with its comment)
    that no user holds now, e.g. after the database was restored: the same person gets
    their uid, and so their files, back."""
    comment = _comment(username)
    for entry in pwd.getpwall():
        if (
            entry.pw_gecos == comment
            and low <= entry.pw_uid <= high
            and entry.pw_uid not in taken
            and entry.pw_gid == entry.pw_uid
        ):
            return AccountData(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)
    return None


def account_exists(data: AccountData) -> bool:
    try:
        entry = pwd.getpwnam(data.name)
    except KeyError:
        return False
    return entry.pw_uid == data.uid


def account_delete(name: str) -> None:
    """userdel + groupdel (the home directory is left to whoever removes the data)."""
    _run(["userdel", name])
    _run(["groupdel", name])
