"""The autoscaler's arithmetic: pure functions, so the policy reads (and tests) alone."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime


def autoscale_target(*, rate: float, capacity: float, low: int, high: int) -> int:
    """Replicas the load needs: ceil(requests/s over replica capacity), within [low, high]."""
    needed = math.ceil(rate / capacity - 1e-9) if capacity > 0 else low
    return max(low, min(high, needed))


@dataclass
class ScaleDecision:
    desired: int
    scale_down_since: datetime | None  # when a lower target was first seen


def autoscale_decide(
    *,
    current: int,
    target: int,
    now: datetime,
    scale_down_since: datetime | None,
    delay_s: float,
) -> ScaleDecision:
    """Scale up at once; scale down only after the lower target has held for delay_s
    (a pause in traffic should not stop replicas that take seconds to start again)."""
    if target >= current:
        return ScaleDecision(target, None)
    since = scale_down_since or now
    if (now - since).total_seconds() >= delay_s:
        return ScaleDecision(target, None)
    return ScaleDecision(current, since)
