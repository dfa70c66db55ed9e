"""A short-lived cache of API reads, shared by the web server's processes through Redis.

Dashboards and scripts poll the same few lists (clusters, a cluster's jobs and nodes, a
job, the operations) many times a second; each answer costs a few milliseconds of CPU
to build from the database, and on a small control plane that CPU is what clients queue
for. So a token-authenticated `GET /api/v1/...` that answered 200 with JSON is kept for
MTC_API_READ_CACHE_SECONDS (default 1 s; 0 turns the cache off) and served again to the
same user for the same URL and Accept header. Every hit still checks the token, so a
revoked token stops at once, and every entry carries a MAC under the secret key, so one
planted by whoever reached Redis is ignored.

Staleness is bounded both ways:
- A write through the API (POST, PUT, PATCH or DELETE under /api/v1/ that is not
  refused with a 4xx) moves a generation for its path and its parents (moved_paths).
  A read keeps its own path's generation with its answer and misses once that moved.
  So, whoever reads: a cancel is seen by the job's next read, a submit by the job
  list's, a deleted cluster by the cluster's.
- Everything else (the poller's state changes, a form in the dashboard, a write through
  another path) shows within the TTL.
The generation is read before the view runs: a write that commits while the answer is
being built moves it, so that answer is never served.

Redis unreachable: reads go through uncached (and a write that could not move its
generations is seen within the TTL); it is tried again after RETRY_AFTER seconds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import time

from django.conf import settings
from django.http import HttpResponse
from django.utils.crypto import constant_time_compare, salted_hmac

from ..redisconn import deployment_namespace, redis_client
from .auth import TokenAuthentication

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1/"
MAX_BODY = 256 * 1024  # larger answers (a long job output) are built each time
RETRY_AFTER = 10.0  # seconds without the cache after Redis failed
# Hop-by-hop and per-response headers are not replayed.
SKIP_HEADERS = frozenset({"connection", "date", "server", "set-cookie", "content-length"})
_AUTH = TokenAuthentication()


class _Store:
    """The process's Redis client for the cache, and whether Redis failed lately."""

    def __init__(self) -> None:
        self.down_until = 0.0

    def get(self):
        if time.monotonic() < self.down_until:
            return None
        url = getattr(settings, "MTC_API_READ_CACHE_URL", "") or settings.REDIS_URL
        return redis_client(url, timeout=0.5)

    def failed(self, exc: Exception) -> None:
        log.warning("API read cache off for %.0f s: Redis said %r", RETRY_AFTER, exc)
        self.down_until = time.monotonic() + RETRY_AFTER


_store = _Store()


def _namespace() -> str:
    return deployment_namespace("mtc:api")


def moved_paths(path: str) -> list[str]:
    """The reads a write to `path` moves: the path and each parent, except that the
    top-level collection (/api/v1/clusters) moves only for a write to it or to one of its
    items. A job submitted to /api/v1/clusters/c/jobs changes that list and cluster c's
    page, not the list of clusters; a cancel (/api/v1/clusters/c/jobs/1/cancel) changes
    the job and the job list; deleting cluster c changes c and the list of clusters."""
    parts = path[len(API_PREFIX) :].strip("/").split("/")
    if not parts[0]:
        return []
    lowest = 1 if len(parts) <= 2 else 2
    return [API_PREFIX + "/".join(parts[:n]) for n in range(len(parts), lowest - 1, -1)]


def _signature(key: str, value: bytes) -> bytes:
    mac = salted_hmac("mtc.api.readcache", key.encode() + b"\n" + value, algorithm="sha256")
    return mac.hexdigest().encode()


def _signed(key: str, value: bytes) -> bytes:
    """An entry as stored: a MAC of its key and value under the secret key, then the value.
    Whoever reaches Redis without the secret key cannot plant an answer mtc would serve."""
    return _signature(key, value) + b"\n" + value


def _verified(key: str, entry: bytes) -> bytes | None:
    mac, _, value = entry.partition(b"\n")
    if not constant_time_compare(mac, _signature(key, value)):
        log.warning("API read cache: an entry that mtc did not sign was ignored (%s)", key)
        return None
    return value


def _generation_key(ns: str, path: str) -> str:
    return f"{ns}:gen:{hashlib.sha1(path.encode()).hexdigest()}"


class ApiReadCacheMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response
        self.ns: str | None = None

    def __call__(self, request):
        ttl = settings.MTC_API_READ_CACHE_SECONDS
        if ttl <= 0 or not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        if self.ns is None:
            self.ns = _namespace()
        if request.method == "GET":
            return self.read(request, ttl)
        response = self.get_response(request)
        # A refused write (4xx) changed nothing, so anyone's bad request leaves the cache be.
        if request.method not in ("HEAD", "OPTIONS", "TRACE") and not (
            400 <= response.status_code < 500
        ):
            self.moved(request.path, ttl)
        return response

    def read(self, request, ttl: float):
        user = self.token_user(request)
        client = _store.get() if user is not None else None
        if client is None:
            return self.get_response(request)
        path = request.path.rstrip("/")
        accept = request.META.get("HTTP_ACCEPT", "")
        digest = hashlib.sha1(f"{request.get_full_path()}\n{accept}".encode()).hexdigest()
        entry_key = f"{self.ns}:r:{user.pk}:{digest}"
        try:
            generation, entry = client.mget([_generation_key(self.ns, path), entry_key])
        except Exception as exc:  # any Redis failure: serve uncached, never a 500
            _store.failed(exc)
            return self.get_response(request)
        generation = (generation or b"-").decode()
        if entry is not None and (value := _verified(entry_key, entry)) is not None:
            head, _, body = value.partition(b"\n")
            meta = json.loads(head)
            if meta["g"] == generation:
                return self.replay(meta, body)
        response = self.get_response(request)
        if self.keepable(response):
            meta = {
                "g": generation,
                "s": response.status_code,
                "h": [[k, v] for k, v in response.items() if k.lower() not in SKIP_HEADERS],
            }
            value = json.dumps(meta).encode() + b"\n" + response.content
            try:
                client.set(entry_key, _signed(entry_key, value), px=max(1, int(ttl * 1000)))
            except Exception as exc:
                _store.failed(exc)
        response["X-Mtc-Cache"] = "miss"
        return response

    def token_user(self, request):
        """The token's user (also handed to DRF's authentication: one lookup); None when
        the request has no token or a bad one (the view answers it, uncached)."""
        try:
            found = _AUTH.authenticate(request)
        except Exception:  # AuthenticationFailed: the view says 401 in the API's shape
            return None
        if found is None:
            return None
        request.mtc_token_auth = found
        return found[0]

    @staticmethod
    def keepable(response) -> bool:
        return (
            response.status_code == 200
            and not response.streaming
            and response.get("Content-Type", "").startswith("application/json")
            and len(response.content) <= MAX_BODY
            and not response.cookies
        )

    @staticmethod
    def replay(meta: dict, body: bytes) -> HttpResponse:
        response = HttpResponse(body, status=meta["s"])
        for name, value in meta["h"]:
            response[name] = value
        response["X-Mtc-Cache"] = "hit"
        return response

    def moved(self, path: str, ttl: float) -> None:
        """A write under `path`: every read of it or a parent path misses from now on."""
        client = _store.get()
        if client is None:
            return
        token = secrets.token_hex(8)
        keep = max(60, int(ttl * 10))  # outlives any entry
        try:
            pipe = client.pipeline(transaction=False)
            for parent in moved_paths(path):
                pipe.set(_generation_key(self.ns, parent), token, ex=keep)
            pipe.execute()
        except Exception as exc:
            _store.failed(exc)
