"""What serving keeps (mtc.retention; README, "Retention"): request records for
MTC_RETENTION_ENDPOINT_REQUESTS_DAYS; an endpoint's events, and its ended replicas
with their run directories, for MTC_RETENTION_ENDPOINT_HISTORY_DAYS. An endpoint itself
is never purged (it goes when its owner deletes it), nor a replica that may still run."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import Q

from clusters.runroot import run_root_or_none
from mtc.retention import BATCH, Budget, batched_delete, path_remove

from .choices import DONE_REPLICA_STATES
from .models import EndpointEvent, EndpointRequest, Replica


def requests_purge(cutoff: datetime, budget: Budget) -> int:
    return batched_delete(EndpointRequest.objects.filter(time__lt=cutoff), budget)


def history_purge(cutoff: datetime, budget: Budget) -> int:
    events = batched_delete(EndpointEvent.objects.filter(time__lt=cutoff), budget)
    ended = Replica.objects.filter(state__in=DONE_REPLICA_STATES).filter(
        Q(end_time__lt=cutoff) | Q(end_time__isnull=True, create_time__lt=cutoff)
    )
    replicas = 0
    while not budget.spent:
        rows = list(
            ended.select_related("endpoint__cluster")
            .only("id", "run_dir", "endpoint__cluster__cluster_id")
            .order_by("pk")[:BATCH]
        )
        if not rows:
            break
        pks = [r.pk for r in rows]
        with transaction.atomic():  # guarded: a replica that changed meanwhile stays
            ended.filter(pk__in=pks).delete()
            kept = set(Replica.objects.filter(pk__in=pks).values_list("pk", flat=True))
        replicas += len(rows) - len(kept)
        for replica in rows:
            if replica.pk in kept or not replica.run_dir:
                continue
            root = run_root_or_none(replica.endpoint.cluster)
            if root is not None:
                path_remove(replica.run_dir, root=root)
        if len(rows) < BATCH:
            break
    return events + replicas
