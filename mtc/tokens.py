"""API tokens stored as sha256 hashes: the database holds no usable secret."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.utils import timezone

PREFIX_LEN = 8


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def token_create(*, user, name: str = "default", expires_days: int | None = None):
    """A new token for ``user``; returns (row, key). The key is never stored."""
    from .models import ApiToken

    key = secrets.token_hex(20)
    expires = timezone.now() + timedelta(days=expires_days) if expires_days else None
    row = ApiToken.objects.create(
        user=user, name=name, prefix=key[:PREFIX_LEN], key_hash=key_hash(key), expires=expires
    )
    return row, key


def tokens_of(*, user):
    from .models import ApiToken

    return ApiToken.objects.filter(user=user)


def token_revoke(*, user, token_id: int) -> bool:
    return tokens_of(user=user).filter(pk=token_id).delete()[0] > 0


def token_rotate(*, user, token_id: int):
    """A new key for the token's name and expiry; the old key stops working. None if not own."""
    old = tokens_of(user=user).filter(pk=token_id).first()
    if old is None:
        return None
    days = None
    if old.expires:
        days = max(1, (old.expires - timezone.now()).days)
    old.delete()
    return token_create(user=user, name=old.name, expires_days=days)
