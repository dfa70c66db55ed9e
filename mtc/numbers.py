"""Whole numbers typed by people: ASCII digits only.

``str.isdigit()`` is true for "²" and "١٢", which ``int()`` then refuses or reads as 12:
every number from a query string, a form or a model reference goes through here.
"""

from __future__ import annotations

MAX_DIGITS = 18  # past any id, offset or count mtc keeps (and int() of 10,000 digits is slow)


def is_whole_number(text: str) -> bool:
    """``text`` is 1 to MAX_DIGITS ASCII digits."""
    return 0 < len(text) <= MAX_DIGITS and text.isascii() and text.isdigit()
