"""Providers make a cluster's machines: ``local`` (Slurm daemons on this host) and
``gce`` (Compute Engine). ``get_provider`` is the one way in."""

from __future__ import annotations

from .base import Provider, ProviderError


def get_provider(name: str) -> Provider:
    # Only the provider asked for is imported: google-cloud-compute takes about a second
    # to import, which a worker's first local cluster should not wait for.
    if name == "local":
        from .local import LocalProvider

        return LocalProvider()
    if name == "gce":
        from .gce import GceProvider

        return GceProvider()
    raise ProviderError(
        f"Provider '{name}' is not available in this installation.",
        code="PROVIDER_UNAVAILABLE",
        permanent=True,
    )
