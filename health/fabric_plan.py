"""The fabric check's plan and verdict, as pure functions (no Django, no Slurm).

Pairs: the pool's nodes in two passes of disjoint pairs (the second shifted by one), after
Google's Cluster Health Scanner: a bad node drags down the pair it is in in each pass, so
it is in failing pairs in both passes, while each good node has a good partner in at least
one pass. With an odd count the node left over in a pass is paired again with the pass's
second node (no pair repeats across passes), in a later wave (a node runs one test at a
time); three nodes get each of their three pairs in a pass of its own.

Verdict: a pair fails when its all-reduce bus bandwidth is below a floor:
- on real GPUs, per machine type (``GPU_FLOOR_GBPS``);
- on emulated nodes (CPUs, gloo), ``RELATIVE_FLOOR`` (0.4) x the pool's typical figure: the
  median over nodes of each node's best pair. A node's best pair says what its own links
  can do, so one bad node (in half the pairs of a 4-node pool) does not pull the reference
  down, as a median over pairs would.
A node is bad when it is in a failing pair in every pass it is in, and is in two passes
or more (with two nodes, one pass: a failing pair makes both bad; nothing tells them apart).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

# Emulated nodes share a few host cores with each other and everything else on the host:
# a good pair's figure swings by up to 2x with the host's load. Measured on a loaded 2-core
# host, 4 nodes: good pairs 0.55 to 1.45 x the median, pairs with a node under the `fabric`
# fault (duty 0.95) 0.09 to 0.26 x; 0.4 keeps both sides of that apart.
RELATIVE_FLOOR = 0.4

# Floors for real GPUs, one rank (one GPU) per node, in GB/s of all-reduce bus bandwidth:
# half the line rate of the NIC that GPU's traffic leaves by. Line rates from Google
# Cloud's GPU machine types page (https://cloud.google.com/compute/docs/gpus, "network
# bandwidth" per machine type): A3 Ultra and A4 have 8 x 400 Gbps RDMA NICs (one per GPU,
# 50 GB/s), A3 Mega 8 x 200 Gbps (25 GB/s), A3 High 4 x 200 Gbps for 8 GPUs (12.5 GB/s a
# GPU). Half of it leaves room for protocol overhead and a busy spine; a link that does
# worse is broken or misconfigured. A type not listed is judged like emulated nodes.
GPU_FLOOR_GBPS: dict[str, float] = {
    "a4-highgpu-8g": 25.0,
    "a3-ultragpu-8g": 25.0,
    "a3-megagpu-8g": 12.5,
    "a3-highgpu-8g": 6.25,
}

Pair = tuple[str, str]


def pairings(nodes: list[str]) -> list[list[Pair]]:
    """Two passes of pairs over ``nodes`` (one pass for two nodes, none for fewer)."""
    if len(nodes) < 2:
        return []
    if len(nodes) == 2:
        return [[(nodes[0], nodes[1])]]  # nothing to shift: the pair is the verdict
    if len(nodes) == 3:
        a, b, c = nodes
        return [[(a, b)], [(b, c)], [(c, a)]]
    return [_pass(list(nodes)), _pass(nodes[1:] + nodes[:1])]


def _pass(order: list[str]) -> list[Pair]:
    pairs = [(order[i], order[i + 1]) for i in range(0, len(order) - 1, 2)]
    if len(order) % 2:
        pairs.append((order[-1], order[1]))
    return pairs


def waves(pairs: list[Pair]) -> list[list[Pair]]:
    """``pairs`` in waves that each use a node at most once (run a wave at a time)."""
    out: list[list[Pair]] = []
    for pair in pairs:
        for wave in out:
            if not any(set(pair) & set(other) for other in wave):
                wave.append(pair)
                break
        else:
            out.append([pair])
    return out


@dataclass
class Verdict:
    floor_gbps: float | None  # None: no figures to judge by
    basis: str  # how the floor was set, in words
    failing: list[dict] = field(default_factory=list)  # the failing results
    bad_nodes: dict[str, list[dict]] = field(default_factory=dict)  # node -> its failing pairs


def floor_for(results: list[dict], machine_type: str, real_gpus: bool) -> tuple[float | None, str]:
    if real_gpus and machine_type in GPU_FLOOR_GBPS:
        floor = GPU_FLOOR_GBPS[machine_type]
        return floor, f"{machine_type}: half the line rate of a GPU's NIC ({floor} GB/s)"
    best: dict[str, float] = {}
    for result in results:
        for node in result["nodes"]:
            best[node] = max(best.get(node, 0.0), float(result.get("bus_gbps") or 0.0))
    if len(best) < 3:
        return None, "fewer than 3 nodes measured: no pool median to compare with"
    typical = statistics.median(best.values())
    return (
        RELATIVE_FLOOR * typical,
        f"{RELATIVE_FLOOR:g} x the pool's median of each node's best pair ({typical:.3f} GB/s)",
    )


def verdict(
    passes: list[list[Pair]],
    results: list[dict],
    *,
    machine_type: str = "",
    real_gpus: bool = False,
) -> Verdict:
    """Judge ``results`` (node/fabric.py's lines, each with "nodes", "bus_gbps" and "pass",
    the index of its pass). A planned pair with no result failed (it did not finish)."""
    floor, basis = floor_for(results, machine_type, real_gpus)
    found = {(r["pass"], tuple(sorted(r["nodes"]))): r for r in results}
    failing: list[dict] = []
    for index, pairs in enumerate(passes):
        for pair in pairs:
            result = found.get((index, tuple(sorted(pair))))
            if result is None:
                failing.append({"pass": index, "nodes": list(pair), "bus_gbps": None})
            elif floor is not None and float(result.get("bus_gbps") or 0.0) < floor:
                failing.append(result)
    bad: dict[str, list[dict]] = {}
    for node in {n for pairs in passes for pair in pairs for n in pair}:
        its_passes = {i for i, pairs in enumerate(passes) if any(node in p for p in pairs)}
        mine = [r for r in failing if node in r["nodes"]]
        if len(its_passes) >= min(2, len(passes)) and {r["pass"] for r in mine} == its_passes:
            bad[node] = mine
    return Verdict(floor, basis, failing, dict(sorted(bad.items())))
