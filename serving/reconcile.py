"""An endpoint's reconcile (beat, every few seconds): take in the routed requests, check
each replica (its job's state as the poller stored it, its address file, its /health),
replace replicas that died, scale to the load, and finish a delete. Safe to run twice:
one runs at a time per endpoint, and every state change is guarded."""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis
from django.utils import timezone

from jobs.choices import TERMINAL_STATES, JobState
from mtc import userfs
from mtc.db import bulk_insert
from slurm.hostlist import expand_hostlist

from . import conf, traffic
from .autoscale import autoscale_decide, autoscale_target
from .choices import (
    DONE_REPLICA_STATES,
    LIVE_REPLICA_STATES,
    EndpointState,
    EventKind,
    ReplicaState,
)
from .models import Endpoint, EndpointRequest, Replica
from .selectors import replica_owner_uid
from .services import (
    event_add,
    replica_job_cancel,
    replica_mark_unhealthy,
    replica_start,
    replica_stop,
    replica_transition,
)
from .transport import ReplicaTimeout, ReplicaUnreachable, replica_call

log = logging.getLogger(__name__)
HOST_RE = re.compile(r"[A-Za-z0-9._:%-]{1,255}")  # a name, IPv4 or IPv6 (Replica.host holds 255)
REPLICA_FILE_MAX = 64 * 1024  # replica.json is a line of JSON
RESTOP_AFTER_S = 15  # a stopping replica whose job still runs gets another scancel


def requests_ingest(endpoint: Endpoint) -> int:
    """Move the router's records of finished requests from Redis into the database."""
    records = traffic.requests_drain(endpoint.pk)
    rows = [
        {
            "endpoint_id": endpoint.pk,
            "time": datetime.fromtimestamp(at, tz=UTC),
            "latency_ms": latency,
            "status": status,
            "replica_number": replica,
        }
        for at, latency, status, replica in records
    ]
    bulk_insert(EndpointRequest, rows)
    return len(rows)


def request_rate(endpoint: Endpoint, now: datetime) -> float:
    since = now - timedelta(seconds=endpoint.load_window_s)
    count = EndpointRequest.objects.filter(endpoint=endpoint, time__gt=since).count()
    return count / endpoint.load_window_s


def replica_address(replica: Replica) -> tuple[str, int] | None:
    """The address the replica's server wrote once it listened, if it is this job's."""
    try:
        # The replica's job writes this file in its owner's folder: read without
        # following a link, a regular file of theirs, at most 64 KiB.
        raw = userfs.read_bytes(Path(replica.run_dir) / "replica.json", limit=REPLICA_FILE_MAX)
        state = json.loads(raw)
        job_id, restart = str(state.get("job_id")), int(state.get("restart", 0))
        host, port = str(state["host"]), int(state["port"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    job = replica.job
    if job_id != job.job_id or restart < job.requeue_count:
        return None  # an earlier run's file
    # The job writes this file: an address no socket takes is none (and a longer host or a
    # NUL would fail the row's update on PostgreSQL at every reconcile).
    if not HOST_RE.fullmatch(host) or not 0 < port < 65536:
        return None
    if not host_is_the_jobs_node(replica, host):
        return None  # mtc would call, with the endpoint's token, wherever a job pointed it
    return host, port


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def host_is_the_jobs_node(replica: Replica, host: str) -> bool:
    """The replica's own node: loopback on a local cluster, else the node Slurm ran it on
    (by name or a fully qualified name under it), never another host of the network."""
    if replica.endpoint.cluster.provider == "local":
        return host in LOOPBACK_HOSTS
    nodes = expand_hostlist(replica.job.node_list)
    return any(host == node or host.startswith(node + ".") for node in nodes)


def replica_health(endpoint: Endpoint, replica: Replica) -> tuple[bool, str, dict]:
    try:
        response = replica_call(
            replica.host,
            replica.port,
            "GET",
            "/health",
            token=endpoint.replica_token,
            timeout=conf.health_timeout_s(),
            owner_uid=replica_owner_uid(endpoint),
        )
    except (ReplicaUnreachable, ReplicaTimeout) as exc:
        return False, f"health check failed: {exc}", {}
    if response.status != 200:
        return False, f"health check answered HTTP {response.status}", {}
    try:
        return True, "", json.loads(response.body)
    except ValueError:
        return False, "health check answered something other than JSON", {}


def _replica_failed(endpoint: Endpoint, replica: Replica, message: str, now: datetime) -> None:
    if not replica_transition(
        replica,
        LIVE_REPLICA_STATES,
        ReplicaState.FAILED,
        health_message=message[:500],  # the column's length: PostgreSQL refuses more
        end_time=now,
    ):
        return
    if replica.ready_time is None:
        endpoint.failed_starts += 1
    event_add(endpoint, EventKind.REPLICA_FAILED, f"replica {replica.number}: {message}")


def replica_observe(endpoint: Endpoint, replica: Replica, now: datetime) -> None:
    """Move one replica along: STARTING -> READY <-> UNHEALTHY, and to its end."""
    job = replica.job
    if replica.state == ReplicaState.STOPPING:
        if job is None or job.state in TERMINAL_STATES:
            replica_transition(replica, {ReplicaState.STOPPING}, ReplicaState.STOPPED, end_time=now)
        elif replica.stop_time and (now - replica.stop_time).total_seconds() > RESTOP_AFTER_S:
            replica_job_cancel(replica)
        return
    if job is None:
        _replica_failed(endpoint, replica, "its job record is gone", now)
        return
    if job.state in TERMINAL_STATES:
        _replica_failed(endpoint, replica, f"job {job.job_id} ended {job.state}", now)
        return
    if job.state != JobState.RUNNING:
        if replica.state != ReplicaState.STARTING:  # requeued under it: it starts over
            replica_transition(replica, {replica.state}, ReplicaState.STARTING, host="", port=None)
        waiting = f"job {job.state}" + (f" ({job.reason})" if job.reason else "")
        if replica.health_message != waiting:
            replica.health_message = waiting
            Replica.objects.filter(pk=replica.pk).update(health_message=waiting)
        return

    if not replica.host:
        address = replica_address(replica)
        if address is None:
            started = job.start_time or replica.create_time
            if (now - started).total_seconds() > conf.start_timeout_s():
                replica_stop(replica=replica, reason="never answered; replacing it")
            return
        replica.host, replica.port = address
        Replica.objects.filter(pk=replica.pk).update(host=replica.host, port=replica.port)

    ok, message, health = replica_health(endpoint, replica)
    if ok:
        first = replica.ready_time is None
        if replica_transition(
            replica,
            {ReplicaState.STARTING, ReplicaState.UNHEALTHY},
            ReplicaState.READY,
            health_message="",
            unhealthy_since=None,
            ready_time=replica.ready_time or now,
        ):
            endpoint.failed_starts = 0
            if "chat" in health:
                endpoint.chat = bool(health["chat"])
            took = f" after {(now - replica.create_time).total_seconds():.1f} s" if first else ""
            event_add(endpoint, EventKind.REPLICA_READY, f"replica {replica.number} answers{took}")
        Replica.objects.filter(pk=replica.pk).update(last_health_time=now)
        return
    if replica.state == ReplicaState.STARTING:
        return  # it wrote its address, so it is up in a moment (or the timeout catches it)
    if not userfs.is_file(Path(replica.run_dir) / "replica.json"):
        # The server removes its address file when it exits: the process is gone.
        _replica_failed(endpoint, replica, f"its server exited ({message})", now)
        replica_job_cancel(replica)
        return
    if replica.state == ReplicaState.READY:
        replica_mark_unhealthy(replica=replica, message=message)
    elif replica.unhealthy_since and (
        (now - replica.unhealthy_since).total_seconds() > conf.unhealthy_grace_s()
    ):
        replica_stop(replica=replica, reason=f"unhealthy too long ({message}); replacing it")


def _stop_order(replica: Replica) -> tuple:
    """Which replicas go first when scaling down: those not serving, then the newest."""
    rank = {ReplicaState.UNHEALTHY: 0, ReplicaState.STARTING: 1, ReplicaState.READY: 2}
    return (rank.get(replica.state, 0), -replica.number)


def endpoint_delete_step(endpoint: Endpoint, replicas: list[Replica]) -> None:
    for replica in replicas:
        if replica.state in LIVE_REPLICA_STATES:
            replica_stop(replica=replica, reason="endpoint deleted")
    if all(r.state in DONE_REPLICA_STATES for r in replicas):
        traffic.traffic_forget(endpoint.pk)
        endpoint.delete()  # lets the registry delete the version again (PROTECT)


def endpoint_scale(endpoint: Endpoint, now: datetime) -> None:
    rate = request_rate(endpoint, now)
    target = autoscale_target(
        rate=rate,
        capacity=endpoint.target_rps_per_replica,
        low=endpoint.min_replicas,
        high=endpoint.max_replicas,
    )
    current = max(endpoint.min_replicas, min(endpoint.max_replicas, endpoint.desired_replicas))
    decision = autoscale_decide(
        current=current,
        target=target,
        now=now,
        scale_down_since=endpoint.scale_down_since,
        delay_s=endpoint.scale_down_delay_s,
    )
    endpoint.scale_down_since = decision.scale_down_since
    if decision.desired != endpoint.desired_replicas:
        event_add(
            endpoint,
            EventKind.SCALED,
            f"{endpoint.desired_replicas} -> {decision.desired} replicas "
            f"({rate:.2f} requests/s over {endpoint.load_window_s} s; "
            f"{endpoint.target_rps_per_replica:g} per replica)",
        )
        endpoint.desired_replicas = decision.desired
        endpoint.last_scale_time = now


def endpoint_resize(endpoint: Endpoint, replicas: list[Replica]) -> None:
    """Start or stop replicas until the live ones match desired_replicas."""
    live = [r for r in replicas if r.state in LIVE_REPLICA_STATES]
    if len(live) > endpoint.desired_replicas:
        for replica in sorted(live, key=_stop_order)[: len(live) - endpoint.desired_replicas]:
            replica_stop(replica=replica, reason="scaled down")
        return
    for _ in range(endpoint.desired_replicas - len(live)):
        if endpoint.failed_starts >= conf.max_failed_starts():
            endpoint.state = EndpointState.FAILED
            endpoint.status_message = (
                f"{endpoint.failed_starts} replicas in a row ended before they answered; "
                "see their jobs' output. mtc stopped restarting them."
            )
            event_add(endpoint, EventKind.FAILED, endpoint.status_message)
            return
        replica = replica_start(endpoint=endpoint)
        if replica is None:
            return
        replicas.append(replica)
        endpoint.status_message = ""


def _endpoint_state(endpoint: Endpoint, replicas: list[Replica], now: datetime) -> str:
    if any(r.state == ReplicaState.READY for r in replicas):
        endpoint.last_ready_time = now
        return EndpointState.READY
    return EndpointState.DEGRADED if endpoint.last_ready_time else EndpointState.DEPLOYING


SAVED = (
    "state",
    "status_message",
    "chat",
    "desired_replicas",
    "scale_down_since",
    "last_scale_time",
    "failed_starts",
    "last_ready_time",
)


def endpoint_reconcile(*, endpoint_id: int) -> None:
    lock = traffic.reconcile_lock(endpoint_id)
    if not lock.acquire():
        return  # another worker is on it
    try:
        endpoint = (
            Endpoint.objects.select_related("cluster", "version__model", "owner")
            .filter(pk=endpoint_id)
            .first()
        )
        if endpoint is None:
            return
        now = timezone.now()
        requests_ingest(endpoint)
        replicas = list(
            endpoint.replicas.exclude(state__in=DONE_REPLICA_STATES).select_related("job")
        )
        for replica in replicas:
            replica.endpoint = endpoint
            replica_observe(endpoint, replica, now)
        if endpoint.state == EndpointState.DELETING:
            endpoint_delete_step(endpoint, replicas)
            return
        if endpoint.state != EndpointState.FAILED:
            endpoint_scale(endpoint, now)
            endpoint_resize(endpoint, replicas)
        if endpoint.state != EndpointState.FAILED:
            endpoint.state = _endpoint_state(endpoint, replicas, now)
        # Guarded: a delete that came in meanwhile wins.
        fields = {f: getattr(endpoint, f) for f in SAVED}
        Endpoint.objects.filter(pk=endpoint.pk).exclude(state=EndpointState.DELETING).update(
            **fields, update_time=now
        )
        requests_prune(endpoint, now)
    finally:
        try:
            lock.release()
        except redis.exceptions.LockError:  # expired meanwhile: nothing to release
            pass


def requests_prune(endpoint: Endpoint, now: datetime) -> None:
    """Drop request records past retention (once a minute per endpoint is plenty)."""
    if now.second >= 5:  # reconciles come every few seconds: one lands in each minute's start
        return
    keep_s = conf.request_retention_s()
    if keep_s is None:
        return
    # One minute's worth at most here; a backlog goes in batches (serving.retention).
    cutoff = now - timedelta(seconds=keep_s)
    EndpointRequest.objects.filter(
        pk__in=EndpointRequest.objects.filter(endpoint=endpoint, time__lt=cutoff).values("pk")[
            :1000
        ]
    ).delete()
