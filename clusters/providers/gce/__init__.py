"""The gce provider (Compute Engine)."""

from .provider import GceProvider

__all__ = ["GceProvider"]
