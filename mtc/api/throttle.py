"""Per-caller API rate limits, counted in the shared Redis: a fixed one-minute window per
API token (per user for a session), one INCR a request. Over the limit: 429 with
``Retry-After`` (the seconds left in the window) in the API's error shape. Redis away:
the request goes through (limits are a guard against a runaway client, not an access
rule) and the failure is logged."""

from __future__ import annotations

import logging
import time

from django.conf import settings
from rest_framework.throttling import BaseThrottle

from ..redisconn import deployment_namespace, redis_client

log = logging.getLogger(__name__)
WINDOW_S = 60


class TokenRateThrottle(BaseThrottle):
    def allow_request(self, request, view) -> bool:
        limit = int(getattr(settings, "MTC_API_RATE_PER_MINUTE", 0) or 0)
        user = getattr(request, "user", None)
        if limit <= 0 or user is None or not user.is_authenticated:
            return True  # anonymous requests are refused by authentication anyway
        token = getattr(request, "auth", None)
        # The token's stored hash names it for good (a row id may come back after a
        # restore); a session counts per user.
        key_hash = getattr(token, "key_hash", "")
        caller = f"t{key_hash[:24]}" if key_hash else f"u{user.pk}"
        now = time.time()
        window = int(now // WINDOW_S)
        self.retry_after = (window + 1) * WINDOW_S - now
        key = f"{deployment_namespace('mtc:throttle')}:{caller}:{window}"
        try:
            pipe = redis_client(settings.REDIS_URL, timeout=0.5).pipeline(transaction=False)
            pipe.incr(key)
            pipe.expire(key, WINDOW_S * 2)
            count = pipe.execute()[0]
        except Exception as exc:  # noqa: BLE001 - no Redis: no limit, never a 500
            log.warning("API rate limit not counted: %r", exc)
            return True
        return count <= limit

    def wait(self) -> float:
        return max(1.0, getattr(self, "retry_after", WINDOW_S))
