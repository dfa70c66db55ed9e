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
