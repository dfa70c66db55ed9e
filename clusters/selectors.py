"""Reads for pages and the API: one query per list, whatever its length."""

from django.db.models import Count, Prefetch, Q, QuerySet, Sum
from django.db.models.functions import Coalesce

from .choices import CLUSTER_LIVE_STATES, OPERATION_ACTIVE_STATES, OperationKind, OperationState
from .models import Cluster, Node, Operation

_READY = Q(nodes__slurm_state__in=["IDLE", "ALLOCATED", "MIXED", "COMPLETING"])


def live_clusters() -> QuerySet[Cluster]:
    """The clusters the polls visit: those whose daemons should be up."""
    return Cluster.objects.filter(state__in=CLUSTER_LIVE_STATES).order_by("pk")


def cluster_list() -> QuerySet[Cluster]:
    return (
        Cluster.objects.select_related("owner")
        .annotate(
            node_count=Count("nodes", distinct=True),
            ready_node_count=Count("nodes", filter=_READY, distinct=True),
            gpu_count=Coalesce(Sum("nodes__gpus"), 0),  # 0, not null, for a cluster without nodes
        )
        .order_by("cluster_id")
    )


def cluster_get(cluster_id: str) -> Cluster:
    return cluster_list().prefetch_related("pools").get(cluster_id=cluster_id)


def cluster_nodes(cluster: Cluster) -> QuerySet[Node]:
    return cluster.nodes.select_related("pool").order_by("pool__pool_id", "index")


# What the cluster page's grid and counts read of each node.
NODE_TILE_FIELDS = (
    "pool_id",
    "name",
    "slurm_state",
    "slurm_reason",
    "spare",
    "health",
    "health_message",
    "gpus",
    "gpu_type",
    "gpus_emulated",
    "cpus",
)


def cluster_node_tiles(cluster: Cluster) -> list:
    """The cluster's nodes as light rows (named tuples of NODE_TILE_FIELDS), in grid
    order: a page of thousands of nodes spends its time building model instances
    otherwise."""
    return list(
        cluster.nodes.order_by("pool__pool_id", "index").values_list(*NODE_TILE_FIELDS, named=True)
    )


def cluster_operations(cluster: Cluster, limit: int = 10) -> list[Operation]:
    return list(cluster.operations.all()[:limit])


# A repair's Operation waits PENDING (for approval or its turn) without holding the
# cluster: pages do not treat it as work in progress.
WAITING_REPAIR = Q(kind=OperationKind.REPAIR_NODE, state=OperationState.PENDING)


def cluster_active_operation(cluster: Cluster) -> Operation | None:
    return (
        cluster.operations.filter(state__in=OPERATION_ACTIVE_STATES).exclude(WAITING_REPAIR).first()
    )


def node_state_counts(clusters: QuerySet[Cluster] | None = None) -> dict[str, int]:
    qs = Node.objects.all()
    if clusters is not None:
        qs = qs.filter(cluster__in=clusters)
    return dict(qs.values_list("slurm_state").annotate(n=Count("id")).order_by("slurm_state"))


def clusters_with_nodes() -> QuerySet[Cluster]:
    """Clusters with their nodes prefetched in one extra query (dashboard grids)."""
    return cluster_list().prefetch_related(
        Prefetch("nodes", queryset=Node.objects.order_by("pool__pool_id", "index"))
    )


def cluster_search(*, q: str = "", state: str = "") -> QuerySet[Cluster]:
    """cluster_list, narrowed by a text search on id/display name and a state."""
    qs = cluster_list()
    if q:
        qs = qs.filter(Q(cluster_id__icontains=q) | Q(display_name__icontains=q))
    if state:
        qs = qs.filter(state=state)
    return qs


def cluster_state_counts() -> dict[str, int]:
    """How many clusters are in each state (one query)."""
    return dict(Cluster.objects.values_list("state").annotate(n=Count("id")).order_by("state"))


def operations_recent(limit: int = 8) -> list[Operation]:
    """The latest Operations of every cluster, newest first (one query)."""
    return list(Operation.objects.select_related("cluster").order_by("-create_time")[:limit])


def operations_active_exist() -> bool:
    """Whether any Operation is pending or running (pages then refresh faster)."""
    return (
        Operation.objects.filter(state__in=OPERATION_ACTIVE_STATES).exclude(WAITING_REPAIR).exists()
    )


def gpu_total() -> int:
    """GPUs on every node of every cluster (one query)."""
    return Node.objects.aggregate(n=Sum("gpus"))["n"] or 0
