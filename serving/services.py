"""Writes on endpoints: deploy, delete, start and stop replicas (Slurm jobs)."""

from __future__ import annotations

import logging
import secrets
import shlex
from pathlib import Path

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from clusters.providers import get_provider
from clusters.runroot import NoRunRoot
from identity.services import IdentityMissing
from jobs import services as job_services
from mtc import userfs
from mtc.queue import queue_require, task_enqueue
from slurm import SlurmError
from slurm.submit import SubmissionError

from . import conf
from .choices import LIVE_REPLICA_STATES, EndpointState, EventKind, ReplicaState
from .deploy import DeployPlan
from .models import Endpoint, EndpointEvent, Replica

log = logging.getLogger(__name__)

REPLICA_SCRIPT = r"""#!/bin/bash
# mtc endpoint {endpoint_id} ({name}): replica {number}, serving {model_name}
#   from {model_dir}
set -euo pipefail
export OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} TOKENIZERS_PARALLELISM=false
# The model is a local directory: never reach for the Hugging Face Hub.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1
export TRANSFORMERS_VERBOSITY=error PYTHONPATH={repo}
echo "mtc: endpoint {endpoint_id} replica {number}, job $SLURM_JOB_ID on $(hostname)"
exec {python} -m node.replica.server --model-dir {model_dir} --name {model_name} \
  --token-file {run_dir}/token --state-file {run_dir}/replica.json \
  --host {bind} --advertise {advertise} --threads {threads}
"""


def event_add(endpoint: Endpoint, kind: str, message: str) -> None:
    EndpointEvent.objects.create(
        endpoint=endpoint, time=timezone.now(), kind=kind, message=message[:500]
    )


def endpoint_create(*, plan: DeployPlan, owner) -> Endpoint:
    """Record the endpoint; its reconcile (queued once this commits) starts the replicas."""
    queue_require()
    with transaction.atomic():
        endpoint = Endpoint.objects.create(
            name=plan.name,
            owner=owner,
            version=plan.version,
            version_alias=plan.version_alias,
            cluster=plan.cluster,
            partition=plan.partition,
            chat=plan.chat,
            min_replicas=plan.min_replicas,
            max_replicas=plan.max_replicas,
            desired_replicas=plan.min_replicas,
            cpus_per_replica=plan.cpus_per_replica,
            gpus_per_replica=plan.gpus_per_replica,
            target_rps_per_replica=plan.target_rps_per_replica,
            load_window_s=plan.load_window_s,
            scale_down_delay_s=plan.scale_down_delay_s,
            replica_token=secrets.token_urlsafe(32),
        )
        by = f" (alias '{plan.version_alias}')" if plan.version_alias else ""
        event_add(
            endpoint,
            EventKind.DEPLOYED,
            f"{owner.username} deployed {plan.version}{by} on {plan.cluster.cluster_id}, "
            f"{plan.min_replicas}-{plan.max_replicas} replicas",
        )
        task_enqueue("serving.tasks.endpoint_reconcile", endpoint.pk)
    return endpoint


def endpoint_delete(*, endpoint: Endpoint, actor) -> Endpoint:
    """Mark it DELETING; the reconcile stops its replicas, then deletes the row."""
    with transaction.atomic():
        changed = (
            Endpoint.objects.filter(pk=endpoint.pk)
            .exclude(state=EndpointState.DELETING)
            .update(state=EndpointState.DELETING, status_message="Stopping replicas")
        )
        if changed:
            event_add(endpoint, EventKind.DELETING, f"delete requested by {actor.username}")
        task_enqueue("serving.tasks.endpoint_reconcile", endpoint.pk)
    endpoint.state = EndpointState.DELETING  # the row itself may be gone by now
    return endpoint


def replica_run_dir(endpoint: Endpoint, number: int) -> Path:
    """``serving/endpoint-<pk>/replica-<n>`` in the endpoint owner's folder of the
    cluster (their account's alone when jobs run as their owners). Raises
    IdentityMissing when the owner has no account."""
    account = job_services.job_account(endpoint.owner)
    root = job_services.job_root(endpoint.cluster, account) / "serving"
    run_dir = root / f"endpoint-{endpoint.pk}" / f"replica-{number}"
    if account is not None and account.isolated:
        with job_services.owner_folders():
            for path in (root, run_dir.parent, run_dir):
                userfs.dir_own(path, account)
    else:  # single-user mode: the cluster's folder, mtc's own
        userfs.dir_pass(run_dir, mode=0o755)
    return run_dir


def _token_write(path: Path, token: str, account) -> None:
    """Readable by the replica's account only: the token is all that guards its port.
    A new file, the account's from the start, renamed over whatever had the name (a
    link the account left there is replaced, never followed)."""
    with job_services.owner_folders():
        userfs.write(path, token + "\n", account=account, mode=0o600)


def replica_script(endpoint: Endpoint, number: int, run_dir: Path) -> str:
    local = endpoint.cluster.provider == "local"
    provider = get_provider(endpoint.cluster.provider)  # where the node runtime is
    version = endpoint.version
    return REPLICA_SCRIPT.format(
        endpoint_id=endpoint.pk,
        name=endpoint.name,
        number=number,
        model_name=shlex.quote(endpoint.served_model),
        model_dir=shlex.quote(version.export_path),
        threads=endpoint.cpus_per_replica * conf.replica_threads(),
        repo=shlex.quote(provider.node_root()),
        python=shlex.quote(provider.node_python()),
        run_dir=shlex.quote(str(run_dir)),
        # A local cluster's nodes are all this host; elsewhere mtc calls the node by name.
        bind="127.0.0.1" if local else "0.0.0.0",
        advertise="127.0.0.1" if local else '"$(hostname -f)"',
    )


def _start_failed(endpoint: Endpoint, message: str) -> None:
    """Say why on the endpoint, in the row and in the caller's copy (the reconcile
    writes its copy's status back at the end of its round)."""
    endpoint.status_message = message[:500]
    Endpoint.objects.filter(pk=endpoint.pk).update(status_message=endpoint.status_message)


def replica_start(*, endpoint: Endpoint) -> Replica | None:
    """Submit one replica job. None (and a status message) when Slurm refuses."""
    Endpoint.objects.filter(pk=endpoint.pk).update(replica_counter=F("replica_counter") + 1)
    number = Endpoint.objects.values_list("replica_counter", flat=True).get(pk=endpoint.pk)
    try:
        run_dir = replica_run_dir(endpoint, number)
        account = job_services.job_account(endpoint.owner)
        mine = account if account is not None and account.isolated else None
        _token_write(run_dir / "token", endpoint.replica_token, mine)
    except (IdentityMissing, NoRunRoot, job_services.FolderConflict) as exc:
        _start_failed(endpoint, f"Could not start a replica: {exc}")
        return None
    job_body = {
        "name": f"serve-{endpoint.name}-r{number}",
        "script": replica_script(endpoint, number, run_dir),
        "nodes": 1,
        "cpus_per_task": endpoint.cpus_per_replica,
        "gpus_per_node": endpoint.gpus_per_replica,
        # mtc replaces a replica that dies; Slurm requeueing it too would make two.
        "requeue": False,
    }
    if endpoint.partition:
        job_body["partition"] = endpoint.partition
    try:
        submission = job_services.job_validate(cluster=endpoint.cluster, data=job_body)
        job = job_services.job_submit(
            cluster=endpoint.cluster, owner=endpoint.owner, submission=submission
        )
    except (SubmissionError, job_services.JobConflict, SlurmError) as exc:
        log.warning("endpoint %s: replica %d not submitted: %s", endpoint.pk, number, exc)
        _start_failed(endpoint, f"Could not submit a replica job: {exc}")
        return None
    replica = Replica.objects.create(
        endpoint=endpoint, number=number, job=job, run_dir=str(run_dir)
    )
    message = f"replica {number} submitted as job {job.job_id}"
    event_add(endpoint, EventKind.REPLICA_STARTED, message)
    return replica


def replica_transition(replica: Replica, from_states, to: str, **fields) -> bool:
    """Guarded state change; also updates ``replica`` when it happened."""
    changed = Replica.objects.filter(pk=replica.pk, state__in=list(from_states)).update(
        state=to, **fields
    )
    if changed:
        replica.state = to
        for key, value in fields.items():
            setattr(replica, key, value)
    return bool(changed)


def replica_job_cancel(replica: Replica) -> None:
    """scancel the replica's job; a job that already ended is fine."""
    if replica.job is None:
        return
    try:
        job_services.job_control(
            job=replica.job, action="cancel", actor=f"endpoint {replica.endpoint_id}"
        )
    except job_services.JobConflict:
        pass  # it ended (or is ending) on its own
    except SlurmError as exc:
        log.warning("replica %s: scancel failed (retried later): %s", replica, exc)


def replica_stop(*, replica: Replica, reason: str) -> bool:
    """Stop a live replica (scale down, replacement, delete): STOPPING, then scancel."""
    if not replica_transition(
        replica,
        LIVE_REPLICA_STATES,
        ReplicaState.STOPPING,
        stop_time=timezone.now(),
        health_message=reason[:500],
    ):
        return False
    event_add(replica.endpoint, EventKind.REPLICA_STOPPED, f"replica {replica.number}: {reason}")
    replica_job_cancel(replica)
    return True


def replica_mark_unhealthy(*, replica: Replica, message: str) -> bool:
    """The router's and the health check's verdict: no more requests until it recovers."""
    if not replica_transition(
        replica,
        {ReplicaState.READY},
        ReplicaState.UNHEALTHY,
        health_message=message[:500],
        unhealthy_since=timezone.now(),
    ):
        return False
    event_add(replica.endpoint, EventKind.REPLICA_UNHEALTHY, f"replica {replica.number}: {message}")
    return True
