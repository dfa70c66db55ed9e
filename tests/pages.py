"""What a served page may load: only addresses of this server, never a CDN or another host."""

from __future__ import annotations

import re

# src= and href= of the tags a browser fetches on its own (scripts, styles, icons, images).
_LOADED = re.compile(r"<(?:script|link|img|iframe)\b[^>]*?\b(?:src|href)=[\"']([^\"']*)[\"']", re.I)


def loaded_addresses(html: str) -> list[str]:
    return _LOADED.findall(html)


def assert_loads_nothing_remote(html: str) -> None:
    """Every address the page loads is a path here (a random CSRF token may well spell "cdn")."""
    remote = [a for a in loaded_addresses(html) if not a.startswith("/") or a.startswith("//")]
    assert not remote, f"the page loads from elsewhere: {remote}"
