"""Writes: give a user their POSIX account, from the configured source."""

from __future__ import annotations

import logging

from django.db import IntegrityError, transaction

from .models import PosixAccount
from .selectors import account_for, identity_mode
from .sources import local, single
from .sources.base import AccountData, IdentityMissing

log = logging.getLogger(__name__)

__all__ = ["IdentityMissing", "account_ensure"]


def _store(user, data: AccountData, source: str) -> PosixAccount:
    fields = dict(name=data.name, uid=data.uid, gid=data.gid, home=data.home, source=source)
    account, _ = PosixAccount.objects.update_or_create(user=user, defaults=fields)
    return account


def _local(user, existing: PosixAccount | None) -> PosixAccount:
    if existing is not None and existing.source == "local":
        if local.account_exists(AccountData(existing.name, existing.uid, existing.gid, "")):
            return existing
        log.warning("account %s of %s is gone from this host; making it again", existing, user)
    taken = PosixAccount.objects.filter(source="local").values_list("uid", flat=True)
    data = local.account_create(username=user.get_username(), taken_uids=list(taken))
    try:
        with transaction.atomic():
            return _store(user, data, "local")
    except IntegrityError:
        # Another worker made this user's account at the same moment: keep theirs.
        local.account_delete(data.name)
        account = account_for(user=user)
        if account is None:
            raise
        return account


def account_ensure(*, user) -> PosixAccount:
    """The user's account in the current mode, made on first use. Raises
    IdentityMissing (HTTP 403) when the source has none for them."""
    mode = identity_mode()
    existing = account_for(user=user)
    if mode == "single-user":
        data = single.account_data()
        if existing is not None and existing.source == mode and existing.uid == data.uid:
            return existing
        return _store(user, data, mode)
    if mode == "local":
        return _local(user, existing)
    if mode == "ldap":
        from .sources import ldap  # the directory source, only where it is configured

        data = ldap.account_data(user)
        # slurmd resolves the uid on this host, which has no nss-ldap: make it exist here.
        ldap.account_materialise(data)
        return _store(user, data, mode)
    raise IdentityMissing(f"unknown MTC_IDENTITY {mode!r}")
