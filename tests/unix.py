"""Uids for tests that make Unix accounts of their own with useradd."""

from __future__ import annotations

import random

from identity.sources.local import id_free

# Above every block `make test`'s lanes (MTC_UID_RANGE) and LDAP directories draw from
# (30000-59999), and below nobody (65534): a test's own account never takes a uid that
# another lane's identity code is about to give.
SPARE_UIDS = range(61000, 65000)


def spare_uids(count: int = 1) -> int:
    """The first of `count` consecutive numbers no account or group on this host has."""
    for _ in range(200):
        base = random.randrange(SPARE_UIDS.start, SPARE_UIDS.stop - count)
        if all(id_free(base + n) for n in range(count)):
            return base
    raise RuntimeError(f"no {count} free uids in {SPARE_UIDS}")


def give(path, account) -> None:
    """Hand a tree a test wrote as root to the account (as a user's own job would have
    written it). Test setup only: mtc itself never chowns by path (mtc/userfs.py)."""
    import os

    for dirpath, _dirs, filenames in os.walk(path):
        os.chown(dirpath, account.uid, account.gid)
        for name in filenames:
            os.chown(os.path.join(dirpath, name), account.uid, account.gid)
