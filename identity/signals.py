"""A new mtc user gets their POSIX account as soon as they exist (not only on their
first submit), so their profile shows it and an operator can grant it files at once."""

from __future__ import annotations

import logging

from django.db import transaction

from .selectors import identity_mode
from .sources.base import IdentityMissing

log = logging.getLogger(__name__)


def account_on_user_created(sender, instance, created: bool, **kwargs) -> None:
    if not created or kwargs.get("raw") or identity_mode() != "local":
        return  # ldap accounts come from the directory at sign-in; single-user has one

    def ensure() -> None:
        from .services import account_ensure

        try:
            account_ensure(user=instance)
        except IdentityMissing as exc:  # the first submit tries again and says why
            log.warning("no account for new user %s yet: %s", instance, exc)

    transaction.on_commit(ensure)
