"""What every beat poll shares: one run at a time across all workers and hosts (an
overlap lock in Redis), and a loop over clusters in which one cluster's failure (a
hung or broken controller) is logged and never stops the others."""

from __future__ import annotations

import functools
import logging
import secrets
from collections.abc import Callable, Iterable
from typing import TypeVar

import redis
from django.conf import settings

log = logging.getLogger(__name__)
T = TypeVar("T")
# Compare-and-delete: only the holder's own token releases the lock.
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end"


def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1)


def single_flight(name: str, *, ttl_s: float = 60.0) -> Callable:
    """Run the decorated poll only if no other run of it holds the lock; a skipped run
    returns None. The lock lapses after ``ttl_s`` so a worker that died cannot keep
    it. Without Redis (it is down) the poll runs: polling twice is safe, not polling
    is not."""

    def wrap(func: Callable[..., T]) -> Callable[..., T | None]:
        key = f"mtc:poll:{name}"

        @functools.wraps(func)
        def run(*args, **kwargs):
            token = secrets.token_hex(8)
            try:
                client = _redis()
                if not client.set(key, token, nx=True, px=int(ttl_s * 1000)):
                    log.info("%s skipped: the previous run still holds its lock", name)
                    return None
            except redis.RedisError:
                client = None
            try:
                return func(*args, **kwargs)
            finally:
                if client is not None:
                    try:
                        client.eval(_RELEASE, 1, key, token)
                    except redis.RedisError:
                        pass  # it lapses by itself

        return run

    return wrap


def for_each(items: Iterable[T], work: Callable[[T], int], *, what: str) -> int:
    """``sum(work(item))``; an item whose work raises is logged and counts 0."""
    total = 0
    for item in items:
        try:
            total += work(item) or 0
        except Exception:  # noqa: BLE001 - one cluster must not stop the others
            log.exception("%s of %s failed", what, item)
    return total
