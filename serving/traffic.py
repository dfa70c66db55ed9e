"""Per-request bookkeeping in Redis, cheap enough for the request path: requests in
flight per replica (for least-outstanding routing) and a list of finished requests
that the reconcile moves into the database in bulk (for the figures and autoscaling).
All of it is best effort: a Redis hiccup never fails a request."""

from __future__ import annotations

import json
import logging

import redis
from django.conf import settings

from mtc.redisconn import redis_client as shared_client

log = logging.getLogger(__name__)
MAX_PENDING_RECORDS = 200_000  # a cap, in case no reconcile drains the list for a while
INFLIGHT_TTL_S = 600  # counts a crashed web process left behind fade away


def redis_client() -> redis.Redis:
    return shared_client(settings.REDIS_URL)


def _inflight_key(endpoint_id: int) -> str:
    return f"mtc:serving:{endpoint_id}:inflight"


def _records_key(endpoint_id: int) -> str:
    return f"mtc:serving:{endpoint_id}:requests"


def inflight_counts(endpoint_id: int) -> dict[int, int]:
    try:
        raw = redis_client().hgetall(_inflight_key(endpoint_id))
    except redis.RedisError as exc:
        log.warning("serving: Redis unavailable for routing counts: %s", exc)
        return {}
    return {int(k): int(v) for k, v in raw.items()}


def request_begin(endpoint_id: int, replica_number: int) -> None:
    key = _inflight_key(endpoint_id)
    try:
        pipe = redis_client().pipeline(transaction=False)
        pipe.hincrby(key, str(replica_number), 1)
        pipe.expire(key, INFLIGHT_TTL_S)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("serving: Redis unavailable: %s", exc)


def request_done(endpoint_id: int, replica_number: int) -> None:
    try:
        redis_client().hincrby(_inflight_key(endpoint_id), str(replica_number), -1)
    except redis.RedisError as exc:
        log.warning("serving: Redis unavailable: %s", exc)


def request_record(
    endpoint_id: int, replica_number: int | None, *, at: float, latency_ms: float, status: int
) -> None:
    """Record a finished request (answered or refused) for the reconcile to take in."""
    record = json.dumps([round(at, 3), round(latency_ms, 2), status, replica_number])
    key = _records_key(endpoint_id)
    try:
        pipe = redis_client().pipeline(transaction=False)
        pipe.rpush(key, record)
        pipe.ltrim(key, -MAX_PENDING_RECORDS, -1)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("serving: Redis unavailable: %s", exc)


def requests_drain(endpoint_id: int) -> list[tuple[float, float, int, int | None]]:
    """Take every finished request recorded since the last drain."""
    key = _records_key(endpoint_id)
    pipe = redis_client().pipeline(transaction=True)
    pipe.lrange(key, 0, -1)
    pipe.delete(key)
    raw, _ = pipe.execute()
    return [tuple(json.loads(item)) for item in raw]


def traffic_forget(endpoint_id: int) -> None:
    try:
        redis_client().delete(_inflight_key(endpoint_id), _records_key(endpoint_id))
    except redis.RedisError as exc:
        log.warning("serving: Redis unavailable: %s", exc)


def reconcile_lock(endpoint_id: int):
    """One reconcile per endpoint at a time (beat may queue the next before one ends)."""
    return redis_client().lock(f"mtc:serving:{endpoint_id}:reconcile", timeout=120, blocking=False)
