"""Carrying out a repair (an Operation of kind REPAIR_NODE): drain the node, put a spare
of its pool in its place (clusters/spares.py), requeue its jobs so they resume elsewhere
from their checkpoints, run the action through the provider, and return the node to
service (or to the spares) only once it passes its checks and the fabric check with its
pool's idle nodes (MTC_FABRIC_CHECK_ON_REPAIR)."""

from __future__ import annotations

import logging
import time

from django.utils import timezone

from clusters.models import Node, Operation
from clusters.operations import operation_progress
from clusters.providers import Provider, get_provider
from clusters.spares import node_return_to_service, spare_stand_in
from jobs.choices import ACTIVE_STATES, JobState
from jobs.models import Job, JobEvent
from jobs.services import requeued_startable
from slurm import SlurmError

from .choices import FailureState, RepairAction, RepairState
from .fabric import fabric_check_after_repair
from .models import NodeFailure, Repair
from .policy import dcgm_level_for
from .services import node_health_refresh, repair_plan, report_ingest

log = logging.getLogger(__name__)


def node_job_ids(node: Node) -> list[str]:
    """The jobs Slurm has on the node now (ask before the node is set DOWN)."""
    return get_provider(node.cluster.provider).slurm(node.cluster).node_jobs(node.name)


def node_jobs_requeue(*, node: Node, job_ids: list[str], cause: str) -> list[dict]:
    """Requeue the node's jobs (Slurm may have begun already); record the interruption
    on each. Returns [{"job_id", "steps_lost"}]."""
    cluster = node.cluster
    client = get_provider(cluster.provider).slurm(cluster)
    requeued = []
    now = timezone.now()
    for job_id in job_ids:
        try:
            client.control("requeue", job_id)
        except SlurmError as exc:  # e.g. already requeued by Slurm for the node's failure
            log.info("requeue of %s after %s: %s", job_id, node.name, exc)
        job = Job.objects.filter(cluster=cluster, job_id=job_id).first()
        steps_lost = None
        if job is not None and job.recipe:
            step = job.metrics.get("step")
            saved = job.metrics.get("last_checkpoint_step", 0)
            steps_lost = (step - saved) if step is not None else None
        if job is not None:
            JobEvent.objects.create(
                job=job,
                time=now,
                state=JobState.REQUEUED,
                cause=f"interrupted: node {node.name} {cause}; requeued"
                + (f", {steps_lost} step(s) since the last checkpoint" if steps_lost else ""),
            )
            Job.objects.filter(pk=job.pk, state__in=ACTIVE_STATES).update(
                requeue_count=job.requeue_count + 1
            )
        requeued.append({"job_id": job_id, "steps_lost": steps_lost})
    return requeued


def _start_requeued_now(client, job_ids: list[str], timeout: float = 20) -> None:
    """A job requeued off a dead node is held back by Slurm (BeginTime, about two
    minutes) once its requeue completes: let it start as soon as its earlier run cannot
    end the new one (jobs.services.requeued_startable); one still unsafe at the timeout
    is left to the job poller's release."""
    deadline = time.monotonic() + timeout
    waiting = set(job_ids)
    while waiting and time.monotonic() < deadline:
        held = []
        for job_id in sorted(waiting):
            info = client.job(job_id)
            if info is None or info.state == "RUNNING":
                waiting.discard(job_id)
            elif info.state == "PENDING" and info.reason == "BeginTime":
                held.append(job_id)
        for job_id in requeued_startable(client, held):
            client.job_start_now(job_id)
            waiting.discard(job_id)
        if waiting:
            time.sleep(0.2)


def _spare_for(repair: Repair) -> Node | None:
    """A spare of the pool takes the drained node's place, once per failure (a repair that
    escalates, or a drain upgraded to the repair it held, keeps the first one's spare)."""
    node = repair.node
    if repair.spare_node_id:  # this repair ran before (a worker died): its spare stood in
        return Node.objects.filter(pk=repair.spare_node_id).first()
    if repair.failure_id and (
        Repair.objects.filter(failure_id=repair.failure_id, spare_node__isnull=False)
        .exclude(pk=repair.pk)
        .exists()
    ):
        return None
    try:
        spare = spare_stand_in(node=node)
    except SlurmError as exc:  # the repair goes on; the jobs wait for a free node instead
        log.warning("no spare for %s: %s", node.name, exc)
        return None
    if spare is not None:
        Repair.objects.filter(pk=repair.pk).update(spare_node=spare)
        log.info("%s stands in for %s", spare.name, node.name)
    return spare


def _checks_pass(node: Node, provider, action: str) -> tuple[bool, str]:
    """Run the node's checks once, now, with the deeper DCGM level a node about to return
    to service gets, and store them as a report."""
    if type(provider).node_checks is Provider.node_checks:
        report = None  # the provider cannot reach the node; its own agent reports
    else:
        report = provider.node_checks(
            node.cluster,
            node,
            dcgm_level=dcgm_level_for("post-repair", action),
            trigger="post-repair",
        )
    if report is None:
        return True, "no checks available for this provider"
    row = report_ingest(node=node, report=report, source="agent")
    critical = [f["code"] for f in row.findings if f.get("severity") == "critical"]
    return not critical, ", ".join(critical)


def repair_execute(operation: Operation) -> None:
    repair = Repair.objects.select_related("node__cluster", "failure").get(
        pk=operation.params["repair_id"]
    )
    node = repair.node
    cluster = node.cluster
    provider = get_provider(cluster.provider)
    mode = repair.failure.mode if repair.failure else "repair"
    operation_progress(operation, 10, f"Draining {node.name}")
    job_ids = node_job_ids(node)
    provider.drain_nodes(cluster, [node.name], f"mtc: {mode}")
    if node.name in {n.name for n in provider.dead_nodes(cluster, [node])}:
        # A dead node cannot end its part of a job: DOWN tells Slurm so at once (the
        # drain stays, so the node does not take work when it comes back unchecked).
        provider.slurm(cluster).node_update([node.name], state="DOWN", reason=f"mtc: {mode}")
    spare = _spare_for(repair)
    operation_progress(operation, 20, "Requeueing the node's jobs")
    requeued = node_jobs_requeue(node=node, job_ids=job_ids, cause=mode)
    Repair.objects.filter(pk=repair.pk).update(jobs_requeued=requeued)
    if spare is not None and requeued:
        # The spare is free now: the jobs start at full size without waiting for the repair.
        _start_requeued_now(provider.slurm(cluster), [j["job_id"] for j in requeued])
    operation_progress(operation, 40, f"{repair.action} {node.name}")
    if repair.action == RepairAction.REBOOT:
        provider.reboot_node(cluster, node)
    elif repair.action == RepairAction.REIMAGE:
        provider.reimage_node(cluster, node)
    elif repair.action == RepairAction.REPLACE:
        Node.objects.filter(pk=node.pk).update(provider_id=provider.replace_node(cluster, node))
    if repair.action != RepairAction.DRAIN:
        operation_progress(operation, 60, f"Waiting for {node.name} to register")
        provider.wait_ready(cluster, [node.name], timeout=provider.repair_ready_timeout_s)
        operation_progress(operation, 80, f"Checking {node.name}")
        ok, problems = _checks_pass(node, provider, repair.action)
        if not ok:
            _repair_failed(repair, f"checks still fail after {repair.action}: {problems}")
            return
        operation_progress(operation, 90, f"Fabric check of {node.name}")
        problems = fabric_check_after_repair(node, operation)
        if problems:
            _repair_failed(repair, f"after {repair.action}: {problems}")
            return
        node_return_to_service(node)
    _start_requeued_now(provider.slurm(cluster), [j["job_id"] for j in requeued])
    _repair_succeeded(repair)


def _repair_succeeded(repair: Repair) -> None:
    now = timezone.now()
    Repair.objects.filter(pk=repair.pk).update(state=RepairState.SUCCEEDED, end_time=now)
    if repair.action == RepairAction.DRAIN:
        # Out of service, nothing fixed: the failure stays open, its ladder unspent, and a
        # repeat of it (or an operator) moves on to the repair the drain held back.
        NodeFailure.objects.filter(pk=repair.failure_id, state=FailureState.REPAIRING).update(
            state=FailureState.OPEN
        )
        node_health_refresh(repair.node)
        return
    if repair.failure_id:
        NodeFailure.objects.filter(pk=repair.failure_id).update(repair_attempts=repair.attempt)
    # The node passed all its checks after the action: every failure it had is gone.
    NodeFailure.objects.filter(node_id=repair.node_id).exclude(state=FailureState.RESOLVED).update(
        state=FailureState.RESOLVED, resolved_time=now
    )
    node_health_refresh(repair.node)


def _repair_failed(repair: Repair, message: str) -> None:
    """The action did not fix the node: escalate to the next action of the ladder."""
    now = timezone.now()
    Repair.objects.filter(pk=repair.pk).update(
        state=RepairState.FAILED, end_time=now, message=message[:500]
    )
    if repair.failure_id:
        NodeFailure.objects.filter(pk=repair.failure_id).update(
            state=FailureState.OPEN, repair_attempts=repair.attempt
        )
        failure = NodeFailure.objects.get(pk=repair.failure_id)
        repair_plan(failure=failure)
    node_health_refresh(repair.node)


def repair_operation_failed(operation: Operation, message: str) -> None:
    """Called when the Operation itself failed (provider error, timeout)."""
    repair = Repair.objects.filter(pk=operation.params.get("repair_id")).first()
    if repair is not None and repair.state == RepairState.RUNNING:
        _repair_failed(repair, message)
