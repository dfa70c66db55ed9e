"""Hot spares: nodes of a pool held out of work so that one takes a failed node's place at
once, and a requeued job starts at full size without waiting for the repair.

A spare is healthy and drained in Slurm with the reason ``spare`` (so the scheduler gives it
no job), and flagged ``Node.spare``. The flag is the claim: every change to it is a
compare-and-swap, so two workers never hand out the same spare, and Slurm is told after
the claim is won.

- ``spares_assign``: when a cluster is ready, each pool's last ``spare_node_count`` idle
  nodes become spares.
- ``spare_stand_in``: a repair drains a node; a spare of its pool is undrained in its place.
- ``node_return_to_service``: a repaired node that passed its checks goes back to work, or
  becomes a spare where its pool is short of them.
"""

from __future__ import annotations

import logging

from django.db import transaction

from slurm import SlurmError, SlurmNode

from .choices import NodeLifecycle
from .models import Cluster, Node, NodePool
from .providers import get_provider

log = logging.getLogger(__name__)

SPARE_REASON = "spare"


def _slurm_nodes(cluster: Cluster) -> dict[str, SlurmNode]:
    return {n.name: n for n in get_provider(cluster.provider).slurm(cluster).nodes()}


def _is_free(info: SlurmNode | None) -> bool:
    """Idle, answering, and not drained for something else: fit to be held as a spare."""
    return (
        info is not None
        and info.state == "IDLE"
        and "NOT_RESPONDING" not in info.flags
        and ("DRAIN" not in info.flags or info.reason == SPARE_REASON)
    )


def _is_held_spare(info: SlurmNode | None) -> bool:
    """Drained as a spare, idle and answering: ready to stand in."""
    return (
        info is not None
        and "DRAIN" in info.flags
        and info.reason == SPARE_REASON
        and info.state == "IDLE"
        and "NOT_RESPONDING" not in info.flags
    )


def spare_candidates(nodes: list[Node], seen: dict[str, SlurmNode], wanted: int) -> list[Node]:
    """Which of a pool's nodes to make spares, ``wanted`` of them at most: free ones, the
    last by index first (a scale-down removes those first, and spares go without waiting
    for jobs)."""
    free = [n for n in nodes if not n.spare and _is_free(seen.get(n.name))]
    return sorted(free, key=lambda n: n.index, reverse=True)[: max(0, wanted)]


def spares_assign(*, cluster: Cluster) -> list[str]:
    """Top every pool up to its spare_node_count (idempotent: a ready cluster, a resize, a
    restore may all call it). Returns the names of the nodes made spares now."""
    pools = list(cluster.pools.filter(is_login=False, spare_node_count__gt=0))
    if not pools:
        return []
    client = get_provider(cluster.provider).slurm(cluster)
    seen = _slurm_nodes(cluster)
    made = []
    for pool in pools:
        with transaction.atomic():
            # The pool row locked (PostgreSQL): two assigners count its spares in turn.
            NodePool.objects.select_for_update().filter(pk=pool.pk).first()
            nodes = list(pool.nodes.filter(lifecycle=NodeLifecycle.ACTIVE).order_by("index"))
            short = pool.spare_node_count - sum(1 for n in nodes if n.spare)
            chosen = [
                node
                for node in spare_candidates(nodes, seen, short)
                if Node.objects.filter(pk=node.pk, spare=False).update(spare=True)
            ]
        for node in chosen:
            try:
                client.node_update([node.name], state="DRAIN", reason=SPARE_REASON)
            except SlurmError:
                Node.objects.filter(pk=node.pk).update(spare=False)
                raise
            made.append(node.name)
    if made:
        log.info("%s: spares %s", cluster.cluster_id, ", ".join(made))
    return made


def spare_release(node: Node) -> bool:
    """The node is no spare any more (a repair takes it out, say). True if it was one."""
    was = bool(Node.objects.filter(pk=node.pk, spare=True).update(spare=False))
    node.spare = False
    return was


def spare_stand_in(*, node: Node) -> Node | None:
    """A repair has drained ``node``: undrain a spare of its pool in its place, so the
    node's jobs start again at once. Returns the spare that stood in, or None (the pool
    has none ready, or ``node`` was a spare itself and ran no work to replace)."""
    if spare_release(node):
        return None
    cluster = node.cluster
    candidates = list(
        Node.objects.filter(pool_id=node.pool_id, spare=True, lifecycle=NodeLifecycle.ACTIVE)
        .exclude(pk=node.pk)
        .order_by("index")
    )
    if not candidates:
        return None
    seen = _slurm_nodes(cluster)
    client = get_provider(cluster.provider).slurm(cluster)
    for spare in candidates:
        # The claim first: whoever clears the flag owns this spare.
        if not Node.objects.filter(pk=spare.pk, spare=True).update(spare=False):
            continue
        if not _is_held_spare(seen.get(spare.name)):
            # Down, or drained for something else meanwhile (a person, the node's agent):
            # not a spare any more; its own state stands.
            log.warning("%s: spare %s is not ready in Slurm; skipped", cluster, spare.name)
            continue
        client.node_update([spare.name], state="RESUME")
        spare.spare = False
        return spare
    return None


def node_return_to_service(node: Node) -> str:
    """A repaired node passed its checks: back to work ("service"), or held as a spare
    ("spare") when its pool has fewer than it should. The one place a repair undrains a
    node, so that a later check (the fabric check) can gate it here."""
    client = get_provider(node.cluster.provider).slurm(node.cluster)
    with transaction.atomic():
        # The pool row locked (PostgreSQL): two nodes returning at once count spares in turn.
        pool = NodePool.objects.select_for_update().get(pk=node.pool_id)
        spares = Node.objects.filter(pool_id=pool.pk, spare=True).exclude(pk=node.pk).count()
        as_spare = spares < pool.spare_node_count
        Node.objects.filter(pk=node.pk).update(spare=as_spare)
    node.spare = as_spare
    if as_spare:
        # Still drained by the repair: the drain stays, with the spare's reason.
        client.node_update([node.name], state="DRAIN", reason=SPARE_REASON)
        return "spare"
    client.node_update([node.name], state="RESUME")
    return "service"
