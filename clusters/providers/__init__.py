"""Providers make a cluster's machines: ``local`` (Slurm daemons on this host) and
``gce`` (Compute Engine). ``get_provider`` is the one way in."""

from __future__ import annotations

from .base import Provider, ProviderError


def get_provider(name: str) -> Provider:
    from .gce import GceProvider
    from .local import LocalProvider

    providers: dict[str, type[Provider]] = {"local": LocalProvider, "gce": GceProvider}
    if name not in providers:
        raise ProviderError(
            f"Provider '{name}' is not available in this installation.",
            code="PROVIDER_UNAVAILABLE",
            permanent=True,
        )
    return providers[name]()
