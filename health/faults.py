"""Fault injection for operators and tests (docs/health.md). On the local
provider `kill`, `disk`, `slow`, `straggle`, `hang` and `fabric` are real; the GPU kinds
go through the node's device shim and are emulation."""

from __future__ import annotations

from django.utils import timezone

from clusters.models import Node
from clusters.providers import get_provider
from clusters.providers.local_nodes import REAL_FAULTS


class FaultError(Exception):
    """Unknown kind, or a provider that cannot inject faults (HTTP 400)."""


def fault_kinds() -> tuple[str, ...]:
    from clusters.providers.local_nodes import FAULT_KINDS

    return FAULT_KINDS


def _provider(node: Node):
    provider = get_provider(node.cluster.provider)
    if not hasattr(provider, "fault_inject"):
        raise FaultError(f"The {node.cluster.provider} provider does not inject faults.")
    return provider


def fault_inject(*, node: Node, kind: str, params: dict | None = None) -> dict:
    if kind not in fault_kinds():
        raise FaultError(f"Unknown fault kind '{kind}'; kinds: {', '.join(fault_kinds())}.")
    _provider(node).fault_inject(node.cluster, node, kind, **(params or {}))
    return {
        "node": node.name,
        "kind": kind,
        "injected_at": timezone.now().isoformat(),
        "emulated": kind not in REAL_FAULTS,
    }


def fault_clear(*, node: Node, kind: str | None = None) -> dict:
    if kind is not None and kind not in fault_kinds():
        raise FaultError(f"Unknown fault kind '{kind}'.")
    _provider(node).fault_clear(node.cluster, node, kind)
    return {"node": node.name, "cleared": kind or "all"}
