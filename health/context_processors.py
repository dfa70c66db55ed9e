"""The Repairs nav entry's badge on every page: pending approvals (one count, for
operators only; counted only when a page renders the nav, so fragments pay nothing)."""

from django.utils.functional import SimpleLazyObject

from . import selectors


def nav_repairs(request) -> dict:
    user = getattr(request, "user", None)
    if user is not None and user.is_staff:
        return {"nav_repairs_pending": SimpleLazyObject(selectors.repairs_pending_count)}
    return {}
