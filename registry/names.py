"""Names in the registry and references to a version (``models/<name>@<alias|number>``).

Django-free: the recipe catalog validates ``init_from`` with it, before any database."""

from __future__ import annotations

import re

NAME_RE = r"^[a-z0-9][a-z0-9._-]{0,62}$"
ALIAS_RE = r"^[a-z][a-z0-9_-]{0,31}$"
REF_PREFIX = "models/"
# An alias starts with a letter, a version number with a digit: never ambiguous.
MODEL_REF_RE = re.compile(
    r"^models/(?P<name>[a-z0-9][a-z0-9._-]{0,62})@(?P<ref>[a-z][a-z0-9_-]{0,31}|[1-9][0-9]{0,8})$"
)
NAME_HELP = "Lower-case letters, digits and . _ - (starting with a letter or digit), at most 63."
REF_HELP = "models/<name>@<alias or version number>, e.g. models/tiny-llama@production."


def is_model_ref(value: str) -> bool:
    """Whether ``value`` means a registered version rather than a path."""
    return value.startswith(REF_PREFIX)


def model_ref_parse(value: str) -> tuple[str, str | int] | None:
    """``models/foo@3`` → ("foo", 3); ``models/foo@prod`` → ("foo", "prod"); else None."""
    m = MODEL_REF_RE.fullmatch(value)
    if m is None:
        return None
    ref = m.group("ref")
    return m.group("name"), int(ref) if ref.isdigit() else ref


def model_name_valid(value: str) -> bool:
    return re.fullmatch(NAME_RE, value) is not None
