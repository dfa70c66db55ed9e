"""Django's cache in the shared Redis (the sign-in lockout's counts, the cloud metrics'
short cache): every web and worker process counts the same failures. Redis away: a read
finds nothing and a write is dropped, logged, instead of failing the sign-in page or the
request that asked (the lockout then does not count until Redis is back)."""

from __future__ import annotations

import logging
import time

from django.core.cache.backends.redis import RedisCache
from redis.exceptions import ConnectionError, TimeoutError

log = logging.getLogger(__name__)
UNREACHABLE = (ConnectionError, TimeoutError)
QUIET_S = 30.0  # one warning per this many seconds


class FailOpenRedisCache(RedisCache):
    _warned = 0.0

    def _unreachable(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - FailOpenRedisCache._warned > QUIET_S:
            FailOpenRedisCache._warned = now
            log.warning("cache: Redis unreachable (%s); going on without it", exc)

    def get(self, key, default=None, version=None):
        try:
            return super().get(key, default, version)
        except UNREACHABLE as exc:
            self._unreachable(exc)
            return default

    def get_many(self, keys, version=None):
        try:
            return super().get_many(keys, version)
        except UNREACHABLE as exc:
            self._unreachable(exc)
            return {}

    def add(self, key, value, timeout=None, version=None):
        try:
            return super().add(key, value, timeout, version)
        except UNREACHABLE as exc:
            self._unreachable(exc)
            return False

    def set(self, key, value, timeout=None, version=None):
        try:
            super().set(key, value, timeout, version)
        except UNREACHABLE as exc:
            self._unreachable(exc)

    def incr(self, key, delta=1, version=None):
        try:
            return super().incr(key, delta, version)
        except UNREACHABLE as exc:
            self._unreachable(exc)
            return delta

    def delete(self, key, version=None):
        try:
            return super().delete(key, version)
        except UNREACHABLE as exc:
            self._unreachable(exc)
            return False
