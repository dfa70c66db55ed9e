"""Hot spares without daemons: the spec field, which nodes become spares, and the
compare-and-swap that hands a spare to one repair only. Slurm is swapped at its adapter
(a recording client); tests/test_spares_e2e.py runs the same on real Slurm."""

from __future__ import annotations

import pytest

from clusters import spares
from clusters.choices import NodeLifecycle
from clusters.models import Cluster, Node, NodePool
from clusters.spec import SpecError, validate_cluster_patch, validate_cluster_spec
from slurm.client import SlurmNode

from .conftest import make_spec


def slurm_node(name: str, state: str = "IDLE", flags=(), reason: str = "") -> SlurmNode:
    return SlurmNode(name=name, state=state, flags=tuple(flags), reason=reason, cpus=2, gres="")


class RecordingSlurm:
    """The Slurm adapter's node calls: answers from ``states``, records every update (and
    applies it, as slurmctld would)."""

    def __init__(self, states: dict[str, SlurmNode], before_read=None):
        self.states = states
        self.updates: list[tuple[str, str, str]] = []
        self.before_read = before_read

    def nodes(self) -> list[SlurmNode]:
        if self.before_read:
            self.before_read()
        return list(self.states.values())

    def node_update(self, names: list[str], *, state: str, reason: str = "") -> None:
        for name in names:
            self.updates.append((name, state, reason))
            old = self.states[name]
            if state == "RESUME":
                self.states[name] = slurm_node(name, old.state)
            elif state == "DRAIN":
                self.states[name] = slurm_node(name, old.state, ("DRAIN",), reason)


@pytest.fixture
def slurm(monkeypatch):
    holder: dict = {}

    class Provider:
        def slurm(self, cluster):
            return holder["client"]

    monkeypatch.setattr(spares, "get_provider", lambda name: Provider())

    def install(client: RecordingSlurm) -> RecordingSlurm:
        holder["client"] = client
        return client

    return install


def pool_of(count: int, spare_count: int) -> NodePool:
    cluster = Cluster.objects.create(cluster_id="sp", spec={}, provider="local")
    pool = NodePool.objects.create(
        cluster=cluster,
        pool_id="gpu",
        machine_type="local-2",
        target_node_count=count,
        spare_node_count=spare_count,
    )
    for index in range(count):
        Node.objects.create(
            cluster=cluster,
            pool=pool,
            index=index,
            name=f"sp-gpu-{index}",
            lifecycle=NodeLifecycle.ACTIVE,
        )
    return pool


def names(queryset) -> list[str]:
    return sorted(queryset.values_list("name", flat=True))


# --- the spec ------------------------------------------------------------------------------
def test_spec_takes_spares_fewer_than_the_pool():
    spec = make_spec("sp", nodes=3)
    spec["node_pools"][1]["spare_node_count"] = 1
    assert validate_cluster_spec(spec)["node_pools"][1]["spare_node_count"] == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [(3, "less than the pool's node count (3)"), (-1, "at least 0"), ("1", "integer")],
)
def test_spec_refuses_bad_spare_counts(value, message):
    spec = make_spec("sp", nodes=3)
    spec["node_pools"][1]["spare_node_count"] = value
    with pytest.raises(SpecError) as info:
        validate_cluster_spec(spec)
    assert message in info.value.fields["node_pools[1].spare_node_count"]


def test_login_pool_has_no_spares():
    spec = make_spec("sp", nodes=3)
    spec["node_pools"][0]["spare_node_count"] = 1
    spec["node_pools"][0]["scaling_spec"] = {"min_node_count": 2, "max_node_count": 2}
    with pytest.raises(SpecError) as info:
        validate_cluster_spec(spec)
    assert set(info.value.fields) == {"node_pools[0].spare_node_count"}


def test_api_answers_400_naming_the_field(operator_api, db):
    spec = make_spec("sp", nodes=2)
    spec["node_pools"][1]["spare_node_count"] = 2
    response = operator_api.post("/api/v1/clusters", spec, format="json")
    assert response.status_code == 400, response.content
    assert set(response.json()["error"]["fields"]) == {"node_pools[1].spare_node_count"}
    assert not Cluster.objects.exists()


# --- which nodes ---------------------------------------------------------------------------
def test_candidates_are_the_last_free_nodes():
    nodes = [Node(name=f"n{i}", index=i) for i in range(5)]
    seen = {
        "n0": slurm_node("n0"),
        "n1": slurm_node("n1"),
        "n2": slurm_node("n2", "ALLOCATED"),  # busy
        "n3": slurm_node("n3", flags=("DRAIN",), reason="mtc: DISK_FULL"),  # out for repair
        "n4": slurm_node("n4", "DOWN", ("NOT_RESPONDING",)),
    }
    assert [n.name for n in spares.spare_candidates(nodes, seen, 2)] == ["n1", "n0"]
    assert spares.spare_candidates(nodes, seen, 0) == []
    nodes[1].spare = True  # already one: not chosen again
    assert [n.name for n in spares.spare_candidates(nodes, seen, 2)] == ["n0"]


def test_assign_tops_the_pool_up_once(db, slurm):
    pool = pool_of(4, 2)
    client = slurm(RecordingSlurm({f"sp-gpu-{i}": slurm_node(f"sp-gpu-{i}") for i in range(4)}))
    assert spares.spares_assign(cluster=pool.cluster) == ["sp-gpu-3", "sp-gpu-2"]
    assert client.updates == [("sp-gpu-3", "DRAIN", "spare"), ("sp-gpu-2", "DRAIN", "spare")]
    assert spares.spares_assign(cluster=pool.cluster) == []  # idempotent
    assert names(Node.objects.filter(spare=True)) == ["sp-gpu-2", "sp-gpu-3"]


# --- a spare stands in ---------------------------------------------------------------------
def held(name: str) -> SlurmNode:
    return slurm_node(name, flags=("DRAIN",), reason="spare")


def test_spare_stands_in_once(db, slurm):
    pool = pool_of(3, 1)
    Node.objects.filter(name="sp-gpu-2").update(spare=True)
    client = slurm(
        RecordingSlurm(
            {
                "sp-gpu-0": slurm_node("sp-gpu-0"),
                "sp-gpu-1": slurm_node("sp-gpu-1"),
                "sp-gpu-2": held("sp-gpu-2"),
            }
        )
    )
    first, second = Node.objects.get(name="sp-gpu-0"), Node.objects.get(name="sp-gpu-1")
    spare = spares.spare_stand_in(node=first)
    assert spare is not None and spare.name == "sp-gpu-2"
    assert client.updates == [("sp-gpu-2", "RESUME", "")]
    # The pool has no spare left: the next failure waits for its repair.
    assert spares.spare_stand_in(node=second) is None
    assert client.updates == [("sp-gpu-2", "RESUME", "")]
    assert not Node.objects.filter(pool=pool, spare=True).exists()


def test_a_spare_claimed_by_another_worker_is_not_taken_twice(db, slurm):
    pool_of(3, 1)
    Node.objects.filter(name="sp-gpu-2").update(spare=True)

    def other_worker_wins():
        # Between this worker's read of the candidates and its claim, another one claims
        # the same spare (what a concurrent repair on another node does).
        Node.objects.filter(name="sp-gpu-2", spare=True).update(spare=False)

    client = slurm(
        RecordingSlurm(
            {"sp-gpu-0": slurm_node("sp-gpu-0"), "sp-gpu-2": held("sp-gpu-2")},
            before_read=other_worker_wins,
        )
    )
    assert spares.spare_stand_in(node=Node.objects.get(name="sp-gpu-0")) is None
    assert client.updates == []  # nothing undrained: the spare is the other worker's


def test_a_spare_drained_for_something_else_is_not_undrained(db, slurm):
    pool_of(3, 1)
    Node.objects.filter(name="sp-gpu-2").update(spare=True)
    client = slurm(
        RecordingSlurm(
            {"sp-gpu-2": slurm_node("sp-gpu-2", flags=("DRAIN",), reason="maintenance by ops")}
        )
    )
    assert spares.spare_stand_in(node=Node.objects.get(name="sp-gpu-0")) is None
    assert client.updates == []
    assert not Node.objects.get(name="sp-gpu-2").spare


def test_a_failing_spare_is_released_and_nothing_stands_in(db, slurm):
    pool_of(3, 2)
    Node.objects.filter(name__in=["sp-gpu-1", "sp-gpu-2"]).update(spare=True)
    client = slurm(RecordingSlurm({"sp-gpu-1": held("sp-gpu-1"), "sp-gpu-2": held("sp-gpu-2")}))
    assert spares.spare_stand_in(node=Node.objects.get(name="sp-gpu-2")) is None
    assert client.updates == []
    assert names(Node.objects.filter(spare=True)) == ["sp-gpu-1"]


# --- a repaired node returns ---------------------------------------------------------------
def test_repaired_node_returns_as_spare_while_the_pool_is_short(db, slurm):
    pool_of(3, 1)
    mtc_drain = ("DRAIN",)
    client = slurm(
        RecordingSlurm(
            {
                "sp-gpu-1": slurm_node(
                    "sp-gpu-1", flags=mtc_drain, reason="mtc: NODE_UNRESPONSIVE"
                ),
                "sp-gpu-2": slurm_node("sp-gpu-2", flags=mtc_drain, reason="mtc: DISK_FULL"),
            }
        )
    )
    assert spares.node_return_to_service(Node.objects.get(name="sp-gpu-1")) == "spare"
    assert spares.node_return_to_service(Node.objects.get(name="sp-gpu-2")) == "service"
    assert client.updates == [("sp-gpu-1", "DRAIN", "spare"), ("sp-gpu-2", "RESUME", "")]
    assert names(Node.objects.filter(spare=True)) == ["sp-gpu-1"]


def test_without_spares_a_repaired_node_goes_back_to_work(db, slurm):
    pool_of(2, 0)
    client = slurm(RecordingSlurm({"sp-gpu-0": slurm_node("sp-gpu-0", flags=("DRAIN",))}))
    assert spares.node_return_to_service(Node.objects.get(name="sp-gpu-0")) == "service"
    assert client.updates == [("sp-gpu-0", "RESUME", "")]


def test_a_resize_may_not_leave_only_spares():
    spec = make_spec("sp", nodes=3)
    spec["node_pools"][1]["spare_node_count"] = 1
    clean = validate_cluster_spec(spec)
    body = {"node_pools": [{"id": "gpu", "scaling_spec": {"min_node_count": 1}}]}
    with pytest.raises(SpecError) as info:
        validate_cluster_patch(clean, body)
    assert set(info.value.fields) == {"node_pools[1].spare_node_count"}
    body["node_pools"][0]["scaling_spec"]["min_node_count"] = 2
    assert validate_cluster_patch(clean, body)["node_pools"][1]["spare_node_count"] == 1
