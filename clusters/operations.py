"""Running Operations: idempotent reconciles of desired vs actual state.

A worker claims an Operation with a compare-and-swap on its lease and renews
the lease as it goes; a worker that dies lets the lease lapse and the next one
(or a rerun of the same task) finishes the work. Every step checks what already
exists, so running twice creates nothing twice.

Past 400 lines on purpose: claim, lease, fence and every reconcile step read together."""

from __future__ import annotations

import fcntl
import logging
import random
import secrets
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from slurm import SlurmError

from .choices import (
    CLUSTER_LIVE_STATES,
    CONTROLLER_DOWN_REASON,
    OPERATION_ACTIVE_STATES,
    ClusterState,
    NodeLifecycle,
    OperationKind,
    OperationState,
)
from .models import Cluster, Node, NodePool, Operation
from .providers import ProviderError, get_provider
from .services import operation_enqueue
from .signals import cluster_deleting
from .spares import spares_assign

log = logging.getLogger(__name__)
LEASE = timedelta(seconds=10)
MAX_ATTEMPTS = 5
DRAIN_TIMEOUT_S = 600


class Superseded(Exception):
    """The Operation was ended elsewhere (e.g. a delete); stop quietly."""


# --- lease and progress --------------------------------------------------
def operation_claim(*, operation_id: str) -> Operation | None:
    """Take the Operation if nobody holds a live lease on it; None otherwise. The
    returned Operation carries this claim's lease token: its writes are fenced by it."""
    now = timezone.now()
    token = secrets.token_hex(16)
    taken = Operation.objects.filter(
        Q(lease_expires__isnull=True) | Q(lease_expires__lt=now),
        pk=operation_id,
        state__in=OPERATION_ACTIVE_STATES,
    ).update(
        state=OperationState.RUNNING,
        lease_expires=now + LEASE,
        lease_token=token,
        start_time=now,
    )
    if not taken:
        return None
    operation = Operation.objects.select_related("cluster").get(pk=operation_id)
    Operation.objects.filter(pk=operation_id).update(attempts=operation.attempts + 1)
    operation.attempts += 1
    return operation


def operation_progress(
    operation: Operation, progress: int | None = None, message: str = ""
) -> None:
    """Renew the lease and record progress; raise Superseded, writing nothing, if the
    Operation ended or another worker holds the lease now."""
    fields = {"lease_expires": timezone.now() + LEASE}
    if progress is not None:
        fields["progress"] = progress
    if message:
        fields["status_message"] = message[:500]
    if not _held(operation).update(**fields):
        raise Superseded()
    if progress is not None:
        operation.progress = progress
        if settings.MTC_OPERATION_STEP_DELAY:
            time.sleep(settings.MTC_OPERATION_STEP_DELAY)


def _held(operation: Operation):
    """This worker's Operation, while its claim is the live one."""
    return Operation.objects.filter(
        pk=operation.pk, state=OperationState.RUNNING, lease_token=operation.lease_token
    )


def _finish(operation: Operation, state: str, *, code: str = "", message: str = "") -> bool:
    return bool(
        _held(operation).update(
            state=state,
            progress=100 if state == OperationState.SUCCEEDED else operation.progress,
            status_message="Done" if state == OperationState.SUCCEEDED else message[:500],
            error_code=code,
            error_message=message,
            end_time=timezone.now(),
            lease_expires=None,
        )
    )


def operation_fail(operation: Operation, *, code: str, message: str) -> None:
    finished = _finish(operation, OperationState.FAILED, code=code, message=message)
    on_fail = FAIL_HANDLERS.get(operation.kind)
    if finished and on_fail is not None:
        on_fail(operation, message)  # e.g. a repair escalates; the cluster stays up
        return
    if finished and operation.cluster_id:
        Cluster.objects.filter(pk=operation.cluster_id).exclude(state=ClusterState.DELETING).update(
            state=ClusterState.ERROR, state_message=message[:500]
        )


# --- ports ---------------------------------------------------------------
def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def allocate_ports(count: int) -> list[int]:
    """Ports no cluster in the database uses and nothing on this host listens on.

    Allocation goes round the range from where it last stopped, so a port a deleted
    cluster just released (its sockets may linger in the kernel) is not reused at once."""
    used = set(
        Cluster.objects.exclude(controller_port=None).values_list("controller_port", flat=True)
    )
    used |= set(Node.objects.exclude(port=None).values_list("port", flat=True))
    low, high = settings.MTC_LOCAL_PORT_RANGE
    cursor_file = Path(settings.DATA_DIR) / "port-cursor"
    with open(cursor_file, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        text = fh.read().strip()
        # A new data dir starts at a random point, so two mtc installations (or test
        # runs) on one host rarely reach for the same ports.
        start = (
            int(text) + 1
            if text.isdigit() and low <= int(text) < high
            else (random.randrange(low, high))
        )
        ports: list[int] = []
        for offset in range(high - low + 1):
            port = low + (start - low + offset) % (high - low + 1)
            if port not in used and _port_free(port):
                ports.append(port)
                if len(ports) == count:
                    break
        if len(ports) < count:
            raise ProviderError(
                "No free ports left for local Slurm daemons.", code="RESOURCE_EXHAUSTED"
            )
        fh.seek(0)
        fh.truncate()
        fh.write(str(ports[-1]))
    return ports


def _ensure_controller_port(cluster: Cluster) -> None:
    for _ in range(5):
        if cluster.controller_port:
            return
        port = allocate_ports(1)[0]
        try:
            # Its own savepoint: a refused statement breaks the transaction around it
            # (PostgreSQL aborts it), so a caller's atomic block could not go on.
            with transaction.atomic():
                Cluster.objects.filter(pk=cluster.pk, controller_port=None).update(
                    controller_port=port
                )
        except IntegrityError:
            continue
        cluster.refresh_from_db(fields=["controller_port"])
    if not cluster.controller_port:
        raise ProviderError("Could not reserve a controller port.", code="RESOURCE_EXHAUSTED")


def _ensure_nodes(cluster: Cluster, provider) -> None:
    """Create the missing Node rows of every compute pool (named by index, so never twice)."""
    emulated = provider.gpus_emulated
    for pool in cluster.pools.filter(is_login=False):
        have = set(pool.nodes.values_list("index", flat=True))
        missing = [i for i in range(pool.target_node_count) if i not in have]
        for _ in range(5):
            if not missing:
                break
            ports = allocate_ports(len(missing)) if provider.uses_ports else [None] * len(missing)
            try:
                with transaction.atomic():
                    for index, port in zip(missing, ports, strict=True):
                        Node.objects.create(
                            cluster=cluster,
                            pool=pool,
                            index=index,
                            port=port,
                            name=f"{cluster.cluster_id}-{pool.pool_id}-{index}",
                            provider_id=f"{cluster.provider}://{cluster.cluster_id}/"
                            f"{cluster.cluster_id}-{pool.pool_id}-{index}#0",
                            partition=",".join(pool.partitions),
                            cpus=pool.cpus,
                            gpus=pool.accelerator_count,
                            gpu_type=_gpu_type(pool) if pool.accelerator_count else "",
                            gpus_emulated=emulated and pool.accelerator_count > 0,
                        )
                missing = []
            except IntegrityError:  # a port or index taken meanwhile: look again
                have = set(pool.nodes.values_list("index", flat=True))
                missing = [i for i in range(pool.target_node_count) if i not in have]


def _gpu_type(pool: NodePool) -> str:
    from slurm.config import gres_type

    return gres_type(pool.accelerator_type)


# --- reconcile -----------------------------------------------------------
def _nodes_to_remove(cluster: Cluster) -> list[Node]:
    out = []
    for pool in cluster.pools.all():
        target = 0 if pool.is_login else pool.target_node_count
        out += list(pool.nodes.filter(index__gte=target).select_related("pool"))
    return out


def _remove_nodes(operation: Operation, cluster: Cluster, provider, nodes: list[Node]) -> None:
    names = [n.name for n in nodes]
    Node.objects.filter(pk__in=[n.pk for n in nodes]).update(lifecycle=NodeLifecycle.DRAINING)
    if provider.controller_alive(cluster):
        operation_progress(operation, 15, f"Draining {len(names)} node(s) before removal")
        provider.drain_nodes(cluster, names, "mtc: scale down")
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while not provider.nodes_drained(cluster, names):
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"Nodes {', '.join(names)} still run jobs after {DRAIN_TIMEOUT_S}s.",
                    code="DRAIN_TIMEOUT",
                )
            operation_progress(operation, message=f"Waiting for jobs on {len(names)} node(s)")
            time.sleep(1)
    operation_progress(operation, 25, f"Removing {len(names)} node(s)")
    provider.delete_nodes(cluster, nodes)
    Node.objects.filter(pk__in=[n.pk for n in nodes]).delete()


def _reconcile_cluster(operation: Operation) -> None:
    cluster = Cluster.objects.get(pk=operation.cluster_id)
    provider = get_provider(cluster.provider)
    if provider.uses_ports:
        operation_progress(operation, 5, "Reserving ports")
        _ensure_controller_port(cluster)
    removals = _nodes_to_remove(cluster)
    if removals:
        _remove_nodes(operation, cluster, provider, removals)
    _ensure_nodes(cluster, provider)
    nodes = list(cluster.nodes.select_related("pool").order_by("pool__pool_id", "index"))
    operation_progress(operation, 40, f"Starting Slurm controller and {len(nodes)} node(s)")
    provider.apply(cluster, nodes)
    operation_progress(operation, 70, "Waiting for nodes to register with Slurm")
    deadline = time.monotonic() + provider.ready_timeout_s
    while True:
        try:
            provider.wait_ready(cluster, [n.name for n in nodes], timeout=2)
            break
        except ProviderError:
            if time.monotonic() > deadline:
                raise
            operation_progress(operation, message="Waiting for nodes to register with Slurm")
            dead = provider.dead_nodes(cluster, nodes)
            if dead and provider.uses_ports:
                # e.g. a port still held by a process outside mtc: move those nodes
                for node, port in zip(dead, allocate_ports(len(dead)), strict=True):
                    Node.objects.filter(pk=node.pk).update(port=port)
            if dead:  # start them again (a cloud VM that vanished is made anew)
                nodes = list(
                    cluster.nodes.select_related("pool").order_by("pool__pool_id", "index")
                )
                provider.apply(cluster, nodes)
    cluster.nodes.update(lifecycle=NodeLifecycle.ACTIVE)
    provider.nodes_ready(cluster, nodes)
    if cluster.pools.filter(spare_node_count__gt=0).exists():
        operation_progress(operation, 90, "Holding the pools' spare nodes")
        spares_assign(cluster=cluster)
    nodes_sync(cluster=cluster, provider=provider)
    if operation.kind == OperationKind.CREATE_CLUSTER:
        for hook in cluster_created_hooks:
            hook(operation, cluster)
    Cluster.objects.filter(pk=cluster.pk).exclude(state=ClusterState.DELETING).update(
        state=ClusterState.RUNNING, state_message="", update_time=timezone.now()
    )


def _delete_cluster(operation: Operation) -> None:
    cluster = Cluster.objects.filter(pk=operation.cluster_id).first()
    if cluster is None:  # an earlier attempt finished the job
        return
    operation_progress(operation, 20, "Cancelling jobs and stopping daemons")
    try:
        provider = get_provider(cluster.provider)
    except ProviderError as exc:
        if exc.code != "PROVIDER_UNAVAILABLE":
            raise
        provider = None  # it could never have made anything: only the rows are left
    if provider is not None:
        provider.delete_cluster(cluster)
    # Apps above clusters stop what they run for it (the recipes app: its TensorBoard).
    cluster_deleting.send(sender=Cluster, cluster_id=cluster.cluster_id)
    operation_progress(operation, 90, "Removing records")
    cluster.delete()


# Run by a cluster's create Operation once its nodes have registered, before the cluster is
# RUNNING (so before its nodes take work): apps above clusters add theirs (health: the
# fabric check) from their AppConfig.ready().
cluster_created_hooks: list[Callable[[Operation, Cluster], None]] = []

HANDLERS: dict[str, Callable[[Operation], None]] = {
    OperationKind.CREATE_CLUSTER: _reconcile_cluster,
    OperationKind.UPDATE_CLUSTER: _reconcile_cluster,
    OperationKind.DELETE_CLUSTER: _delete_cluster,
}
# What a failed Operation of a kind does instead of putting its cluster in ERROR.
FAIL_HANDLERS: dict[str, Callable[[Operation, str], None]] = {}


def operation_kind_register(
    kind: str,
    handler: Callable[[Operation], None],
    *,
    on_fail: Callable[[Operation, str], None] | None = None,
) -> None:
    """Kinds owned by an app above clusters (node repair: health) are registered by that
    app from its AppConfig.ready(), so this module knows no app above it."""
    HANDLERS[kind] = handler
    if on_fail is not None:
        FAIL_HANDLERS[kind] = on_fail


def operation_execute(*, operation_id: str) -> str:
    """Claim and run one Operation. Returns what happened, for logs and tests."""
    operation = operation_claim(operation_id=operation_id)
    if operation is None:
        return "not-claimed"
    if operation.attempts > MAX_ATTEMPTS:
        operation_fail(
            operation, code="TOO_MANY_ATTEMPTS", message=f"Gave up after {MAX_ATTEMPTS} attempts."
        )
        return "failed"
    if operation.kind == OperationKind.DELETE_CLUSTER and operation.cluster_id:
        # Wait for a superseded create/update to let go of the daemons.
        _wait_for_other_leases(operation)
    try:
        HANDLERS[operation.kind](operation)
    except Superseded:
        return "superseded"
    except (ProviderError, SlurmError) as exc:
        log.warning("operation %s failed: %s", operation.pk, exc)
        operation_fail(operation, code=getattr(exc, "code", "SLURM_ERROR"), message=str(exc))
        return "failed"
    except Exception as exc:  # noqa: BLE001 - recorded on the Operation, then re-raised
        operation_fail(operation, code="INTERNAL", message=f"{type(exc).__name__}: {exc}")
        raise
    _finish(operation, OperationState.SUCCEEDED)
    return "succeeded"


def _wait_for_other_leases(operation: Operation) -> None:
    deadline = time.monotonic() + LEASE.total_seconds() + 5
    while time.monotonic() < deadline:
        others = Operation.objects.filter(
            cluster_id=operation.cluster_id, lease_expires__gt=timezone.now()
        ).exclude(pk=operation.pk)
        if not others.exists():
            return
        operation_progress(operation, message="Waiting for the previous operation to stop")
        time.sleep(0.5)


# --- the poller and recovery --------------------------------------------
def nodes_sync(*, cluster: Cluster, provider=None) -> int:
    """Read Slurm's node states once (one sinfo) and store the changes. Returns rows changed."""
    provider = provider or get_provider(cluster.provider)
    controller_error = "no node registered"
    try:
        seen = {n.name: n for n in provider.describe(cluster)}
    except SlurmError as exc:
        seen, controller_error = {}, str(exc)
        log.info("sinfo for %s failed: %s", cluster.cluster_id, exc)
    now = timezone.now()
    changed = []
    for node in cluster.nodes.all():
        info = seen.get(node.name)
        state = info.display_state.upper() if info else "UNKNOWN"
        reason = info.reason if info else (CONTROLLER_DOWN_REASON if not seen else "")
        if node.slurm_state != state or node.slurm_reason != reason:
            node.slurm_state, node.slurm_reason, node.state_time = state, reason[:300], now
            changed.append(node)
    Node.objects.bulk_update(changed, ["slurm_state", "slurm_reason", "state_time"])
    _update_degraded(cluster, controller_error="" if seen else controller_error)
    return len(changed)


BAD_NODE_STATES = ("DOWN", "UNKNOWN", "FAIL")


def _update_degraded(cluster: Cluster, *, controller_error: str = "") -> None:
    """RUNNING <-> DEGRADED by node health, only when no Operation owns the state; the
    why is in state_message when the controller itself does not answer."""
    bad = Q()
    for word in BAD_NODE_STATES:
        bad |= Q(slurm_state__contains=word)
    bad |= Q(slurm_state__endswith="*")
    degraded = cluster.nodes.filter(bad).exists()
    target, source = (
        (ClusterState.DEGRADED, ClusterState.RUNNING)
        if degraded
        else (ClusterState.RUNNING, ClusterState.DEGRADED)
    )
    message = (
        f"The controller is not answering ({controller_error[:200]}); node checks and "
        "repairs wait until it is back."
        if controller_error
        else ""
    )
    live = Cluster.objects.filter(pk=cluster.pk).exclude(
        operations__state__in=OPERATION_ACTIVE_STATES
    )
    live.filter(state=source).update(state=target, state_message=message)
    if target == ClusterState.DEGRADED:  # already degraded: keep the why current
        live.filter(state=target).exclude(state_message=message).update(state_message=message)


def operations_resume() -> list[str]:
    """Queue every unfinished Operation whose worker is gone (lease lapsed or never taken)."""
    now = timezone.now()
    queued = []
    # A repair's Operation waits PENDING until the health app dispatches it.
    waiting_repairs = Q(kind=OperationKind.REPAIR_NODE, state=OperationState.PENDING)
    for op in Operation.objects.filter(state__in=OPERATION_ACTIVE_STATES).exclude(waiting_repairs):
        if op.lease_expires and op.lease_expires > now:
            operation_enqueue(op, countdown=(op.lease_expires - now).total_seconds() + 0.5)
        elif op.state == OperationState.RUNNING or op.create_time < now - timedelta(seconds=30):
            operation_enqueue(op)
        else:
            continue
        queued.append(str(op.pk))
    return queued


def clusters_restore() -> list[str]:
    """Clusters that should run but whose controller is gone (the host restarted):
    start an Operation that brings their daemons back."""
    restored = []
    for cluster in Cluster.objects.filter(state__in=CLUSTER_LIVE_STATES):
        # Repairs still waiting for their turn do not hold the restore back: it comes
        # first, and they wait while the controller is down.
        busy = cluster.operations.filter(state__in=OPERATION_ACTIVE_STATES).exclude(
            kind=OperationKind.REPAIR_NODE, state=OperationState.PENDING
        )
        if busy.exists():
            continue
        provider = get_provider(cluster.provider)
        try:
            if provider.controller_alive(cluster):
                provider.services_check(cluster)
                continue
        except ProviderError as exc:  # e.g. the cloud API unreachable: look again next round
            log.warning("cannot tell whether %s's controller runs: %s", cluster.cluster_id, exc)
            continue
        with transaction.atomic():
            operation = Operation.objects.create(
                kind=OperationKind.UPDATE_CLUSTER,
                target=f"clusters/{cluster.cluster_id}",
                cluster=cluster,
                params={"reason": "restore"},
                status_message="Restarting daemons after a host restart",
            )
            Cluster.objects.filter(pk=cluster.pk).update(state=ClusterState.UPDATING)
            operation_enqueue(operation)
        restored.append(cluster.cluster_id)
    return restored
