"""The fabric check: all-reduce bus bandwidth over pairs of a pool's nodes (fabric_plan.py
for the pairs and the verdict), run as a Slurm job of mtc's own.

Only idle nodes take part (a node repaired just now as well, still drained), held for the
check by a MAINT reservation, so no user job lands on them mid-check; it is deleted after.
The job's batch script runs each pass's pairs at once, one `srun` of node/fabric.py per
pair, and prints each pair's JSON line; a bad node gets FABRIC_DEGRADED with its pairs and
figures as evidence.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import shlex
import sys
import time
from collections.abc import Callable

from django.conf import settings
from django.utils import timezone

from clusters.models import Cluster, Node, NodePool, Operation
from clusters.operations import operation_progress
from clusters.providers import get_provider
from clusters.runroot import run_root
from slurm import SlurmError
from slurm.client import NODE_NAME_RE

from .choices import Severity
from .fabric_plan import pairings, verdict, waves
from .models import FabricCheck

log = logging.getLogger(__name__)

JOB_TIMEOUT_S = 300  # the whole job: torch's start on every node, then two passes
PAIR_TIME_LIMIT_MIN = 3  # one pair's srun (a hung rendezvous ends here)
ACTIVE_JOB_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED"}
# Prints a TCP port free on the node it runs on (the kernel's pick).
FREE_PORT = 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'

SCRIPT = r"""#!/bin/bash
# mtc fabric check {check_id}: all-reduce bus bandwidth over node pairs, a pass at a time
set -uo pipefail
export PYTHONPATH={repo} OMP_NUM_THREADS=1
PY={python}
# --overlap: a step does not wait for the last one on its node to be released (a wave's
# pairs never share a node).
pair() {{  # pass first second: one node/fabric.py rank on each, rendezvous on the first
  local port
  port=$(srun --overlap --nodes=1 --ntasks=1 --nodelist="$2" "$PY" -IS -c {free_port}) || {{
    echo "mtc: no port on $2 ($1)"; return; }}
  srun --overlap --nodes=2 --ntasks=2 --ntasks-per-node=1 --nodelist="$2,$3" --time={pair_limit} \
    --kill-on-bad-exit=1 "$PY" -m node.fabric \
    --master-addr {master_addr} --master-port "$port" --label "$1" \
    || echo "mtc: pass $1 pair $2 $3 failed"
}}
{body}
"""


def _script(check: FabricCheck, provider_name: str) -> str:
    lines = []
    for index, pairs in enumerate(check.passes):
        lines.append(f'echo "mtc: pass {index + 1} starts $(date -u +%T.%N)"')
        for wave in waves([tuple(p) for p in pairs]):
            lines.append(" ".join(f"pair {index} {a} {b} &" for a, b in wave) + " wait")
    lines.append('echo "mtc: done $(date -u +%T.%N)"')
    return SCRIPT.format(
        check_id=check.pk,
        repo=shlex.quote(str(settings.BASE_DIR)),
        python=shlex.quote(sys.executable),
        free_port=shlex.quote(FREE_PORT),
        pair_limit=PAIR_TIME_LIMIT_MIN,
        # Local nodes are processes on this host; elsewhere the first node by its name.
        master_addr="127.0.0.1" if provider_name == "local" else '"$2"',
        body="\n".join(lines),
    )


def parse_results(text: str) -> list[dict]:
    """node/fabric.py's result lines in a job's output, each with its pass as an int."""
    from node.fabric import RESULT_KEY

    found = []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict) or row.get(RESULT_KEY) != 1:
            continue
        label = str(row.get("label", ""))
        if label.isdigit() and isinstance(row.get("nodes"), list):
            row["pass"] = int(label)
            found.append(row)
    return found


def _idle(client, names: list[str]) -> list[str]:
    state = {n.name: n for n in client.nodes()}
    return [
        name
        for name in names
        if name in state
        and state[name].state == "IDLE"
        and not {"DRAIN", "NOT_RESPONDING", "MAINTENANCE", "RESERVED"} & set(state[name].flags)
    ]


def _reservation_create(client, name: str, nodes: list[str]) -> None:
    user = pwd.getpwuid(os.geteuid()).pw_name
    client.run(
        [
            "scontrol",
            "create",
            "reservation",
            f"ReservationName={name}",
            f"Nodes={','.join(nodes)}",
            "StartTime=now",
            f"Duration={JOB_TIMEOUT_S // 60 + 5}",
            f"Users={user}",
            "Flags=MAINT",
        ]
    )


def _reservation_delete(client, name: str) -> None:
    try:
        client.run(["scontrol", "delete", f"ReservationName={name}"])
    except SlurmError as exc:  # gone already (it ends on its own after its duration)
        log.info("deleting reservation %s: %s", name, exc)


def fabric_check_run(
    *,
    cluster: Cluster,
    pool: NodePool,
    trigger: str,
    operation: Operation | None = None,
    drained: list[str] | None = None,
) -> FabricCheck:
    """Check the pool's idle nodes (and ``drained``: nodes mtc drained, about to be resumed,
    taken in and left drained). Stores and returns the FabricCheck; a node found bad gets
    FABRIC_DEGRADED. A Slurm error ends the check as ERROR and is raised."""
    provider = get_provider(cluster.provider)
    client = provider.slurm(cluster)
    check = FabricCheck.objects.create(
        cluster=cluster, pool=pool, trigger=trigger, operation=operation
    )

    def progress(message: str) -> None:
        if operation is not None:
            operation_progress(operation, message=message)

    names = list(
        Node.objects.filter(cluster=cluster, pool=pool)
        .order_by("index")
        .values_list("name", flat=True)
    )
    forced = [n for n in drained or [] if n in names]
    nodes = [n for n in names if n in set(_idle(client, names)) | set(forced)]
    nodes = [n for n in nodes if NODE_NAME_RE.fullmatch(n)]
    passes = pairings(nodes)
    FabricCheck.objects.filter(pk=check.pk).update(nodes=nodes, passes=passes)
    check.nodes, check.passes = nodes, [[list(p) for p in pairs] for pairs in passes]
    if not passes:
        return _finish(
            check, FabricCheck.State.SKIPPED, message=f"{len(nodes)} idle node(s): nothing to pair"
        )
    reservation = f"mtc_fabric_{check.pk}"
    try:
        progress(f"Fabric check: holding {len(nodes)} idle node(s)")
        _reservation_create(client, reservation, nodes)
        try:
            if forced:  # inside the reservation now: only the check's job lands there
                client.node_update(forced, state="RESUME")
            results = _job_run(check, client, reservation, provider, progress)
        finally:
            if forced:
                client.node_update(forced, state="DRAIN", reason="mtc: fabric check")
            _reservation_delete(client, reservation)
    except SlurmError as exc:
        _finish(check, FabricCheck.State.ERROR, message=str(exc))
        raise
    found = verdict(
        passes,
        results,
        machine_type=pool.machine_type,
        real_gpus=not getattr(provider, "gpus_emulated", True),
    )
    FabricCheck.objects.filter(pk=check.pk).update(
        results=results,
        floor_gbps=found.floor_gbps,
        basis=found.basis[:200],
        bad_nodes=found.bad_nodes,
    )
    check.results, check.floor_gbps, check.bad_nodes = results, found.floor_gbps, found.bad_nodes
    check.basis = found.basis[:200]
    state = FabricCheck.State.FAILED if found.bad_nodes else FabricCheck.State.PASSED
    _finish(check, state, message=f"{len(results)} pair(s) measured; floor: {found.basis}")
    for name, pairs in found.bad_nodes.items():
        _degraded(Node.objects.get(cluster=cluster, name=name), pairs, found)
    return check


def _job_run(
    check, client, reservation: str, provider, progress: Callable[[str], None]
) -> list[dict]:
    out_dir = run_root(check.cluster) / "fabric"
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / f"fabric-{check.pk}.out"
    partition = (check.pool.partitions or [None])[0]
    args = [
        "sbatch",
        "--parsable",
        "--job-name=mtc-fabric",
        f"--reservation={reservation}",
        f"--nodes={len(check.nodes)}",
        f"--nodelist={','.join(check.nodes)}",
        "--ntasks-per-node=1",
        "--exclusive",
        f"--time={JOB_TIMEOUT_S // 60}",
        f"--output={output}",
        f"--chdir={out_dir}",
    ]
    if partition:
        args.append(f"--partition={partition}")
    job_id = client.submit(args, _script(check, check.cluster.provider), {})
    FabricCheck.objects.filter(pk=check.pk).update(job_id=job_id)
    check.job_id = job_id
    deadline = time.monotonic() + JOB_TIMEOUT_S + 30
    try:
        while True:
            info = client.job(job_id)
            if info is None or info.state not in ACTIVE_JOB_STATES:
                break
            if time.monotonic() > deadline:
                raise SlurmError(
                    f"fabric check job {job_id} ran past {JOB_TIMEOUT_S} s", permanent=True
                )
            progress(f"Fabric check: job {job_id} {info.state.lower()}")
            time.sleep(0.5)
    except BaseException:  # timed out, or the Operation was taken over: end the job too
        try:
            client.control("cancel", job_id)
        except SlurmError as exc:
            log.info("cancelling fabric check job %s: %s", job_id, exc)
        raise
    return parse_results(output.read_text(errors="replace") if output.exists() else "")


def _finish(check: FabricCheck, state: str, *, message: str = "") -> FabricCheck:
    now = timezone.now()
    FabricCheck.objects.filter(pk=check.pk).update(state=state, message=message[:500], end_time=now)
    check.state, check.message, check.end_time = state, message[:500], now
    return check


def evidence(node: str, pairs: list[dict], floor: float | None) -> str:
    """e.g. "0.08 GB/s with b (pass 1), 0.09 GB/s with d (pass 2); floor 0.21 GB/s"."""
    parts = []
    for row in pairs:
        other = next((n for n in row["nodes"] if n != node), node)
        figure = "no result" if row.get("bus_gbps") is None else f"{row['bus_gbps']:.3f} GB/s"
        parts.append(f"{figure} with {other} (pass {row['pass'] + 1})")
    return "; ".join(parts) + (f"; floor {floor:.3f} GB/s" if floor is not None else "")


def _degraded(node: Node, pairs: list[dict], found) -> None:
    from .services import failures_update

    found_by = f"all-reduce bus bandwidth {evidence(node.name, pairs, found.floor_gbps)}"
    failures_update(
        node=node,
        findings=[
            {
                "code": "FABRIC_DEGRADED",
                "severity": Severity.CRITICAL,
                "check": "fabric",
                "message": found_by[:500],
            }
        ],
        source="controller",
    )


class FabricCheckConflict(Exception):
    """The cluster cannot be checked now (HTTP 409)."""


def fabric_check_request(*, cluster: Cluster, requested_by=None, trigger: str = "on-demand"):
    """Queue a FABRIC_CHECK Operation for the cluster (the API answers with it)."""
    from clusters.choices import CLUSTER_LIVE_STATES, OPERATION_ACTIVE_STATES, OperationKind
    from clusters.services import operation_enqueue

    if cluster.state not in CLUSTER_LIVE_STATES:
        raise FabricCheckConflict(f"Cluster '{cluster.cluster_id}' is {cluster.state}.")
    running = cluster.operations.filter(
        kind=OperationKind.FABRIC_CHECK, state__in=OPERATION_ACTIVE_STATES
    ).first()
    if running is not None:
        raise FabricCheckConflict(f"A fabric check is already running (operation {running.pk}).")
    operation = Operation.objects.create(
        kind=OperationKind.FABRIC_CHECK,
        target=f"clusters/{cluster.cluster_id}",
        cluster=cluster,
        owner=requested_by,
        params={"trigger": trigger},
        status_message="Queued",
    )
    operation_enqueue(operation)
    return operation


def fabric_check_execute(operation: Operation) -> None:
    """The FABRIC_CHECK Operation: every non-login pool of the cluster, one after another."""
    cluster = Cluster.objects.get(pk=operation.cluster_id)
    for pool in cluster.pools.filter(is_login=False).order_by("pool_id"):
        operation_progress(operation, message=f"Fabric check of pool {pool.pool_id}")
        fabric_check_run(
            cluster=cluster,
            pool=pool,
            trigger=operation.params.get("trigger", "on-demand"),
            operation=operation,
        )


def fabric_check_on_create(operation: Operation, cluster: Cluster) -> None:
    """A new cluster's pools, before it takes work (MTC_FABRIC_CHECK_ON_CREATE). A check
    that cannot run is recorded (ERROR) and does not fail the cluster's creation."""
    if not settings.MTC_FABRIC_CHECK_ON_CREATE:
        return
    for pool in cluster.pools.filter(is_login=False).order_by("pool_id"):
        operation_progress(operation, message=f"Fabric check of pool {pool.pool_id}")
        try:
            fabric_check_run(cluster=cluster, pool=pool, trigger="create", operation=operation)
        except SlurmError as exc:
            log.warning("fabric check of new cluster %s: %s", cluster.cluster_id, exc)


def fabric_check_after_repair(node: Node, operation: Operation | None) -> str:
    """Problems found by the fabric check of a repaired node, still drained, with its pool's
    idle nodes ("" when it passed, was not asked for, or had no partner to pair with)."""
    if not settings.MTC_FABRIC_CHECK_ON_REPAIR:
        return ""
    try:
        check = fabric_check_run(
            cluster=node.cluster,
            pool=node.pool,
            trigger="repair",
            operation=operation,
            drained=[node.name],
        )
    except SlurmError as exc:
        return f"the fabric check could not run: {exc}"
    if node.name in check.bad_nodes:
        return "fabric check: " + evidence(node.name, check.bad_nodes[node.name], check.floor_gbps)
    return ""
