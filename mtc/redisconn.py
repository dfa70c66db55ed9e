"""One Redis client per URL and timeout in each process, for work on the request path:
its connection pool is thread-safe and made anew after a fork (gunicorn's workers), so
requests reuse kept-alive connections instead of connecting each time."""

from __future__ import annotations

from functools import lru_cache

import redis


@lru_cache(maxsize=8)
def redis_client(url: str, timeout: float = 1.0) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
