"""One Redis client per URL and timeout in each process, for work on the request path:
its connection pool is thread-safe and made anew after a fork (gunicorn's workers), so
requests reuse kept-alive connections instead of connecting each time."""

from __future__ import annotations

import hashlib
from functools import lru_cache

import redis
from django.conf import settings


@lru_cache(maxsize=8)
def redis_client(url: str, timeout: float = 1.0) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)


def deployment_namespace(prefix: str) -> str:
    """Keys of one mtc deployment (one database) under ``prefix``: stacks may share a
    Redis."""
    db = settings.DATABASES["default"]
    where = f"{db.get('ENGINE')}|{db.get('HOST')}|{db.get('PORT')}|{db.get('NAME')}"
    return f"{prefix}:{hashlib.sha1(where.encode()).hexdigest()[:12]}"
