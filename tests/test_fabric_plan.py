"""The fabric check's pairs and verdicts (pure functions)."""

from health.fabric_plan import GPU_FLOOR_GBPS, pairings, verdict, waves


def result(index: int, pair: tuple[str, str], gbps: float) -> dict:
    return {"pass": index, "nodes": list(pair), "bus_gbps": gbps}


def measured(passes, slow: set[str], good: float = 1.0, bad: float = 0.2) -> list[dict]:
    return [
        result(i, pair, bad if slow & set(pair) else good)
        for i, pairs in enumerate(passes)
        for pair in pairs
    ]


def test_four_nodes_pair_twice_with_the_second_pass_shifted():
    assert pairings(["a", "b", "c", "d"]) == [[("a", "b"), ("c", "d")], [("b", "c"), ("d", "a")]]


def test_every_node_gets_a_new_partner_in_the_second_pass():
    nodes = [f"n{i}" for i in range(8)]
    first, second = pairings(nodes)
    assert not {frozenset(p) for p in first} & {frozenset(p) for p in second}
    assert sorted(n for p in first for n in p) == sorted(nodes)


def test_odd_count_pairs_the_leftover_again_in_a_later_wave():
    passes = pairings(["a", "b", "c", "d", "e"])
    assert passes[0] == [("a", "b"), ("c", "d"), ("e", "b")]
    for pairs in passes:
        assert sorted({n for p in pairs for n in p}) == ["a", "b", "c", "d", "e"]
    assert waves(passes[0]) == [[("a", "b"), ("c", "d")], [("e", "b")]]
    repeated = {frozenset(p) for p in passes[0]} & {frozenset(p) for p in passes[1]}
    assert not repeated


def test_fewer_than_two_nodes_have_nothing_to_pair():
    assert pairings(["a"]) == [] and pairings([]) == []
    assert pairings(["a", "b"]) == [[("a", "b")]]


def test_one_slow_node_is_bad_and_its_partners_are_not():
    for count in (3, 4, 5, 6, 7, 8, 9):
        nodes = [f"n{i}" for i in range(count)]
        for slow in nodes:
            passes = pairings(nodes)
            v = verdict(passes, measured(passes, {slow}))
            assert list(v.bad_nodes) == [slow], (count, slow, v.bad_nodes)
            assert all(slow in r["nodes"] for r in v.bad_nodes[slow])
            assert len({r["pass"] for r in v.bad_nodes[slow]}) >= 2


def test_a_healthy_pool_has_no_bad_node_despite_noise():
    passes = pairings([f"n{i}" for i in range(6)])
    figures = [0.9, 1.1, 0.7, 1.3, 0.8, 1.0]
    results = [result(i, p, figures.pop()) for i, pairs in enumerate(passes) for p in pairs]
    assert verdict(passes, results).bad_nodes == {}


def test_a_pair_that_did_not_finish_fails():
    passes = pairings(["a", "b", "c", "d"])
    results = [r for r in measured(passes, set()) if "c" not in r["nodes"]]
    v = verdict(passes, results)
    assert list(v.bad_nodes) == ["c"]
    assert all(r["bus_gbps"] is None for r in v.bad_nodes["c"])


def test_real_gpus_are_judged_by_their_machine_type_floor():
    passes = pairings(["a", "b", "c", "d"])
    floor = GPU_FLOOR_GBPS["a3-ultragpu-8g"]
    # The whole pool below the floor: every node is bad (a relative test sees nothing).
    low = measured(passes, set(), good=floor * 0.8)
    assert verdict(passes, low).bad_nodes == {}
    v = verdict(passes, low, machine_type="a3-ultragpu-8g", real_gpus=True)
    assert sorted(v.bad_nodes) == ["a", "b", "c", "d"] and v.floor_gbps == floor
    ok = measured(passes, {"b"}, good=floor * 1.5, bad=floor * 0.9)
    assert list(verdict(passes, ok, machine_type="a3-ultragpu-8g", real_gpus=True).bad_nodes) == [
        "b"
    ]


def test_two_nodes_without_a_floor_are_not_judged():
    passes = pairings(["a", "b"])
    v = verdict(passes, measured(passes, {"a"}))
    assert v.floor_gbps is None and v.bad_nodes == {}


def test_two_gpu_nodes_below_their_floor_are_both_bad():
    passes = pairings(["a", "b"])
    v = verdict(passes, measured(passes, {"a"}), machine_type="a4-highgpu-8g", real_gpus=True)
    assert sorted(v.bad_nodes) == ["a", "b"]
