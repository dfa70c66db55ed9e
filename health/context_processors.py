"""The Repairs nav entry's badge on every page: pending approvals (one count, for
operators only; nothing for others)."""

from . import selectors


def nav_repairs(request) -> dict:
    user = getattr(request, "user", None)
    if user is not None and user.is_staff:
        return {"nav_repairs_pending": selectors.repairs_pending_count()}
    return {}
