"""The algorithm registry, ``auto``, group placement, and the Network on catalog-like fabrics."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import simpy

import clustersim.network as network_pkg
from clustersim import catalog
from clustersim.errors import PartitionError, ScenarioError, SimulationError
from clustersim.network import (
    GroupInfo,
    Network,
    Step,
    algorithm_names,
    choose,
    collective_steps,
    register_algorithm,
    resolve_algorithm,
)
from clustersim.network.collectives import phase_algorithm, registry, torus_grid
from clustersim.network.fabric import Topology, build_topology, chip_node

MIB = 2.0**20
ALL = ["auto", "halving_doubling", "hierarchical", "mesh", "ring", "ring_uni", "torus"]
AR_ONLY = ["double_tree", "nvls", "nvls_sharp", "nvls_tree", "sharp"]
RS_AG_ONLY = ["ring_channels"]


def run(net: Network, op: str, ranks: Any, nbytes: float) -> float:
    env = net.env
    start = env.now
    done = net.collective(op, list(ranks), nbytes)
    env.run(until=done)
    return float(env.now - start)


def one_way_ring(p: int, cap: float = 1e9, lat: float = 2e-6) -> Topology:
    topo = Topology("ring", chips_per_instance=p, local_bw_Bps=1e12)
    for i in range(p):
        topo.add_link(
            chip_node(i), chip_node((i + 1) % p), capacity_Bps=cap, latency_s=lat, kind="neuronlink"
        )
    return topo


# -- steps ----------------------------------------------------------------------------------------


def test_ring_steps() -> None:
    (step,) = collective_steps("all_reduce", 4, 8.0, "ring")
    fwd, bwd = ((0, 1), (1, 2), (2, 3), (3, 0)), ((0, 3), (1, 0), (2, 1), (3, 2))
    # half of each n/p chunk each way; a ring streams, so its rounds are pipelined
    assert step == Step(fwd + bwd, 1.0, 6, pipelined=True)
    assert collective_steps("all_reduce", 4, 8.0, "ring_uni") == [Step(fwd, 2.0, 6, True)]
    assert collective_steps("all_reduce", 2, 8.0, "ring") == [
        Step(((0, 1), (1, 0)), 4.0, 2, pipelined=True)
    ]
    (step,) = collective_steps("all_gather", 4, 8.0, "ring")
    assert (step.repeats, step.bytes_per_flow) == (3, 1.0)
    (step,) = collective_steps("broadcast", 4, 8.0, "ring")
    assert step == Step(((0, 1), (1, 2), (2, 3), (0, 3), (3, 2), (2, 1)), 4.0 / 3, 3, True)
    assert collective_steps("all_reduce", 1, 8.0) == []


def test_direct_steps() -> None:
    steps = collective_steps("all_to_all", 4, 8.0, "pairwise")
    assert len(steps) == 3
    assert steps[1].pairs == ((0, 2), (1, 3), (2, 0), (3, 1))
    assert all(s.bytes_per_flow == 2.0 and s.repeats == 1 for s in steps)
    pairs = ((0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1))
    # a direct reduce-scatter (reduced on arrival), then a direct all-gather
    assert collective_steps("all_reduce", 3, 6.0, "mesh") == [
        Step(pairs, 2.0, reduces=True),
        Step(pairs, 2.0),
    ]
    (step,) = collective_steps("broadcast", 3, 6.0, "mesh")
    assert step.pairs == ((0, 1), (0, 2))


def test_halving_doubling_and_tree_steps() -> None:
    steps = collective_steps("reduce_scatter", 8, 8.0, "halving_doubling")
    assert [s.bytes_per_flow for s in steps] == [4.0, 2.0, 1.0]
    assert steps[0].pairs[:2] == ((0, 1), (1, 0))
    assert steps[2].pairs[:2] == ((0, 4), (1, 5))
    # all-gather: the same rounds in reverse, copied on arrival rather than reduced
    gather = collective_steps("all_gather", 8, 8.0, "halving_doubling")
    assert gather == [replace(s, reduces=False) for s in steps[::-1]]
    assert all(s.reduces for s in steps)
    tree = collective_steps("broadcast", 5, 8.0, "tree")
    assert [s.pairs for s in tree] == [((0, 1),), ((0, 2), (1, 3)), ((0, 4),)]
    up = collective_steps("reduce", 5, 8.0, "tree")
    assert [s.pairs for s in up] == [((4, 0),), ((2, 0), (3, 1)), ((1, 0),)]


def test_hierarchical_and_torus_steps() -> None:
    info = GroupInfo.of([0, 1, 2, 3], [0, 0, 1, 1])
    rs_in, ar_out, ag_in = collective_steps("all_reduce", 4, 8e9, "hierarchical", info)
    assert rs_in.pairs == ((0, 1), (1, 0), (2, 3), (3, 2))
    assert ar_out.pairs == ((0, 2), (2, 0), (1, 3), (3, 1))
    assert (rs_in.bytes_per_flow, ar_out.bytes_per_flow) == (4e9, 2e9)
    assert ag_in == rs_in
    coords = [(x, y) for y in range(2) for x in range(3)]
    grid = GroupInfo.of(range(6), [0] * 6, coords, (3, 2))
    x_rs, y_rs = collective_steps("reduce_scatter", 6, 6.0, "torus", grid)
    assert (x_rs.repeats, x_rs.bytes_per_flow, len(x_rs.pairs)) == (2, 1.0, 12)
    assert (y_rs.repeats, y_rs.bytes_per_flow, len(y_rs.pairs)) == (1, 1.0, 6)


def _c1_steps(nbytes: float) -> list[tuple[int, bool, int, float]]:
    """auto's all-reduce over 2 x trn1.32xlarge, 64 ranks (two a chip), as nccom-test C1:
    each step's (rounds, pipelined, flows, bytes a flow moves a round)."""
    inst, chip = catalog.instance("trn1.32xlarge"), catalog.chip("trn1")
    net = Network(simpy.Environment(), build_topology(inst, chip, 2), [r // 2 for r in range(64)])
    info = net.group_info(range(64))
    assert choose("all_reduce", 64, nbytes, info) == "hierarchical"
    steps = collective_steps("all_reduce", 64, nbytes, "auto", info)
    return [(s.repeats, s.pipelined, len(s.pairs), s.bytes_per_flow) for s in steps]


@pytest.mark.parametrize(
    ("nbytes", "across"),
    [
        # the shard is n / 32: a mesh of two ranks below 1 MB, halving-doubling to 56 MB
        (MIB, [(1, False, 64, MIB / 64)] * 2),
        (16 * MIB, [(1, False, 64, MIB / 4)] * 2),
        (64 * MIB, [(1, False, 64, MIB)] * 2),
        (1024 * MIB, [(1, False, 64, 16 * MIB)] * 2),
        # a shard above 56 MB: a ring of two, one way round
        (4096 * MIB, [(2, True, 64, 64 * MIB)]),
    ],
)
def test_c1_runs_rings_inside_the_instances_at_every_size_from_1_mb(
    nbytes: float, across: list[tuple[int, bool, int, float]]
) -> None:
    """Across instances the in-instance phases run a ring of the 32 ranks from 1 MB up
    (no halving-doubling range, no step at 56 MB): 31 rounds of n / 32, half each way
    round, in both instances at once; across, the Neuron size rule on the shard."""
    ring = (31, True, 128, nbytes / 32 / 2)
    assert _c1_steps(nbytes) == [ring, *across, ring]


def test_c1_small_messages_run_meshes() -> None:
    inside = (1, False, 2 * 32 * 31, 8.0 / 32)
    across = (1, False, 64, 8.0 / 32 / 2)  # the shard, halved between the two instances
    assert _c1_steps(8.0) == [inside, across, across, inside]


def test_phase_algorithms_of_a_hierarchical_collective() -> None:
    for op in ("reduce_scatter", "all_gather"):
        assert phase_algorithm(op, 32, 8.0, inside=True) == "mesh"
        assert phase_algorithm(op, 32, MIB, inside=True) == "ring"
        assert phase_algorithm(op, 32, 16 * MIB, inside=True) == "ring"  # flat: HD
        assert choose(op, 32, 16 * MIB, GroupInfo.flat(32)) == "halving_doubling"
    assert phase_algorithm("all_reduce", 2, 32e3, inside=False) == "mesh"
    assert phase_algorithm("all_reduce", 2, 2 * MIB, inside=False) == "halving_doubling"
    assert phase_algorithm("all_reduce", 2, 64 * MIB, inside=False) == "ring"
    assert phase_algorithm("all_reduce", 6, 2 * MIB, inside=False) == "ring"  # no power of 2


# -- registry -------------------------------------------------------------------------------------


def test_unknown_algorithm_lists_valid_names() -> None:
    with pytest.raises(ScenarioError) as info:
        collective_steps("all_reduce", 4, 8.0, "butterfly")
    assert "cluster.collectives.all_reduce" in str(info.value)
    assert f"valid: {', '.join(sorted([*ALL, *AR_ONLY, 'tree']))}" in str(info.value)
    with pytest.raises(ScenarioError, match="does not implement all_reduce"):
        collective_steps("all_reduce", 4, 8.0, "pairwise")
    with pytest.raises(ScenarioError, match="unknown collective"):
        collective_steps("gossip", 4, 8.0)
    assert algorithm_names("all_to_all") == ["auto", "mesh", "pairwise"]


def test_network_validates_algorithms(specs: Any) -> None:
    topo = build_topology(specs.instance(), specs.chip(), 1)
    with pytest.raises(ScenarioError) as info:
        Network(simpy.Environment(), topo, range(16), {"all_gather": "tree"})
    assert str(info.value).startswith("cluster.collectives.all_gather: algorithm does not")
    assert f"valid: {', '.join(sorted([*ALL, *RS_AG_ONLY]))}" in str(info.value)
    with pytest.raises(ScenarioError, match=r"cluster.collectives.all_reduce: unknown algorithm"):
        Network(simpy.Environment(), topo, range(16), {"all_reduce": "rign"})
    net = Network(simpy.Environment(), topo, range(16), {"all_gather": "ring"})
    assert net.algorithms["all_gather"] == "ring"


@pytest.fixture
def legacy_name() -> Iterator[str]:
    name = "test_legacy_three_argument"
    yield name
    registry._ALGORITHMS.pop(name, None)


def test_three_argument_algorithms_still_register(legacy_name: str) -> None:
    @register_algorithm(legacy_name, ops=("all_gather",))
    def one_shot(op: str, p: int, nbytes: float) -> list[Step]:
        return [Step(tuple((i, (i + 1) % p) for i in range(p)), nbytes, 1)]

    assert collective_steps("all_gather", 3, 6.0, legacy_name)[0].bytes_per_flow == 6.0
    with pytest.raises(ValueError, match="already registered"):
        register_algorithm(legacy_name)(one_shot)


# -- auto -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nbytes", "p", "expected"),
    [
        (64e3, 16, "mesh"),
        (MIB - 1, 64, "mesh"),
        (MIB, 64, "halving_doubling"),
        (56 * MIB, 16, "halving_doubling"),
        (56 * MIB + 1, 16, "ring"),
        (4 * MIB, 12, "ring"),  # not a power of two
        (64e3, 512, "halving_doubling"),  # too many pairs for a mesh
        (64e3, 12, "mesh"),
    ],
)
def test_auto_follows_the_neuron_size_thresholds(nbytes: float, p: int, expected: str) -> None:
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        assert choose(op, p, nbytes, GroupInfo.flat(p)) == expected
        assert resolve_algorithm("auto", op, p, nbytes) == expected


def test_auto_for_other_ops_and_spread_groups() -> None:
    flat = GroupInfo.flat(8)
    assert choose("all_to_all", 8, 1e9, flat) == "mesh"
    assert choose("all_to_all", 512, 1e3, GroupInfo.flat(512)) == "pairwise"
    assert choose("broadcast", 8, 1e3, flat) == "tree"
    assert choose("reduce", 8, 1e9, flat) == "ring"
    spread = GroupInfo.of(range(8), [0, 0, 0, 0, 1, 1, 1, 1])
    assert choose("all_reduce", 8, 1e3, spread) == "hierarchical"
    one_each = GroupInfo.of(range(4), [0, 1, 2, 3])
    assert choose("all_reduce", 4, 1e9, one_each) == "ring"
    uneven = GroupInfo.of(range(5), [0, 0, 0, 1, 1])
    assert choose("all_reduce", 5, 1e9, uneven) == "ring"


def test_resolve_falls_back_where_an_algorithm_does_not_apply() -> None:
    assert resolve_algorithm("halving_doubling", "all_gather", 6, MIB) == "ring"
    assert resolve_algorithm("hierarchical", "all_reduce", 8, MIB) == "ring"
    assert resolve_algorithm("torus", "all_reduce", 8, MIB) == "ring"
    assert resolve_algorithm("ring_uni", "all_reduce", 8, MIB) == "ring_uni"
    with pytest.raises(ValueError, match="power-of-two"):
        registry._ALGORITHMS["halving_doubling"].fn("all_reduce", 6, 1.0, GroupInfo.flat(6))


# -- group placement ------------------------------------------------------------------------------


def test_group_info_relabels_so_alike_groups_are_equal() -> None:
    a = GroupInfo.of([5, 5, 9, 9], [2, 2, 3, 3])
    assert a == GroupInfo.of([0, 0, 1, 1], [0, 0, 1, 1])
    assert a.chip == (0, 0, 1, 1)
    assert a.domain_members() == [[0, 1], [2, 3]]
    assert a.domain_sizes() == (2, 2)
    mixed = GroupInfo.of(range(5), [7, 3, 7, 3, 9])
    assert mixed.domain_members() == [[0, 2], [1, 3], [4]]
    assert mixed.domain_sizes() == (2, 2, 1)
    assert GroupInfo.flat(3) == GroupInfo((0, 1, 2), (0, 0, 0))
    with pytest.raises(ValueError, match="one chip, domain"):
        GroupInfo((0, 1), (0,))


def test_torus_grid() -> None:
    coords = [(x, y) for y in range(2) for x in range(3)]
    found = torus_grid(GroupInfo.of(range(6), [0] * 6, coords, (4, 4)))
    assert found is not None
    assert found[0] == (3, 2)
    assert found[1][4] == (1, 1)
    # two ranks per chip: the on-chip axis first; two domains: the domain axis last
    chips = [c for c in range(4) for _ in range(2)] * 2
    info = GroupInfo.of(
        [c + 4 * (i // 8) for i, c in enumerate(chips)],
        [i // 8 for i in range(16)],
        [(c % 2, c // 2) for c in chips],
        (2, 2),
    )
    found = torus_grid(info)
    assert found is not None
    assert found[0] == (2, 2, 2, 2)
    assert found[1][9] == (1, 0, 0, 1)
    assert torus_grid(GroupInfo.of(range(3), [0] * 3, [(0, 0), (1, 0), (0, 1)], (2, 2))) is None
    assert torus_grid(GroupInfo.flat(4)) is None


def test_network_group_info_from_the_topology(specs: Any) -> None:
    topo = build_topology(specs.instance(), specs.chip(), 2)
    net = Network(simpy.Environment(), topo, [r // 4 for r in range(128)])
    info = net.group_info([0, 1, 4, 64])
    assert info.chip == (0, 0, 1, 2)
    assert info.domain == (0, 0, 0, 1)
    assert info.dims == (4, 4)
    assert info.coords[2] == (1, 0)  # chip 1 sits next to chip 0 on the snake
    # Placed alike (instance 1 first, then instance 0): the same info object.
    assert net.group_info([64, 65, 68, 0]) is info
    assert net.group_info([0, 1, 4, 68]) != info  # chip 17 is not chip 16
    with pytest.raises(SimulationError, match=r"rank 128 is outside 0\.\.127"):
        net.group_info([0, 128])


def test_alike_groups_share_their_steps(specs: Any) -> None:
    topo = build_topology(specs.instance(), specs.chip(), 2)
    net = Network(simpy.Environment(), topo, range(32))
    for base in (0, 2, 16, 18):  # instances 0 and 1, torus positions (0|1, 0) and (2|3, 0)
        net.collective("all_reduce", [base, base + 1], 1e6)
    assert len(net._plans) == 4
    assert len(net._steps) == 2  # same coordinates in another instance: same info


# -- the Network on catalog-like fabrics ---------------------------------------------------------


@pytest.mark.parametrize("p", [2, 4, 8, 16])
@pytest.mark.parametrize("nbytes", [1e4, 1e6, 64e6])
def test_ring_all_reduce_on_the_torus_snake(specs: Any, p: int, nbytes: float) -> None:
    topo = build_topology(specs.instance(), specs.chip(link_efficiency=0.8), 1)
    net = Network(simpy.Environment(), topo, range(16), dict.fromkeys(registry.OPS[:3], "ring"))
    a, b = specs.link_latency_s, 1 / (0.8 * specs.link_Bps)
    both = 2 if p > 2 else 1  # the snake is a duplex ring: half the buffer each way
    expected = 2 * (p - 1) * a + 2 * (p - 1) / p * nbytes * b / both
    assert run(net, "all_reduce", range(p), nbytes) == pytest.approx(expected, rel=0.01)
    expected = (p - 1) * a + (p - 1) / p * nbytes * b / both
    for op in ("reduce_scatter", "all_gather"):
        assert run(net, op, range(p), nbytes) == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_one_way_ring_on_a_one_way_ring(p: int) -> None:
    cap, lat, n = 1e9, 2e-6, 3e6
    algs = dict.fromkeys(registry.OPS[:5], "ring_uni")
    net = Network(simpy.Environment(), one_way_ring(p, cap, lat), range(p), algs)
    assert run(net, "all_reduce", range(p), n) == pytest.approx(
        2 * (p - 1) * lat + 2 * (p - 1) / p * n / cap, rel=0.01
    )
    assert run(net, "reduce_scatter", range(p), n) == pytest.approx(
        (p - 1) * lat + (p - 1) / p * n / cap, rel=0.01
    )
    assert run(net, "broadcast", range(p), n) == pytest.approx((p - 1) * lat + n / cap, rel=0.01)
    assert run(net, "reduce", range(p)[::-1], n) == pytest.approx((p - 1) * lat + n / cap, rel=0.01)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_all_to_all_through_a_switch(specs: Any, p: int) -> None:
    topo = build_topology(specs.instance("switch", dims=(), chips=8), specs.chip(), 1)
    n = 8e6
    a, frac = specs.link_latency_s, (p - 1) / p * n / specs.link_Bps
    pairwise = Network(simpy.Environment(), topo, range(8), {"all_to_all": "pairwise"})
    assert run(pairwise, "all_to_all", range(p), n) == pytest.approx((p - 1) * a + frac, rel=0.01)
    mesh = Network(simpy.Environment(), topo, range(8))  # auto: every pair at once
    assert mesh.algorithm_for("all_to_all", range(p), n) == "mesh"
    assert run(mesh, "all_to_all", range(p), n) == pytest.approx(a + frac, rel=0.01)


def test_ring_across_instances_is_bound_by_efa(specs: Any) -> None:
    topo = build_topology(specs.instance(), specs.chip(), 2)
    net = Network(simpy.Environment(), topo, range(32), {"all_reduce": "ring"})
    p, n = 32, 64e6
    efa_Bps = specs.efa_Bps / 16
    # each EFA crossing carries one direction's half: n / (2p) a round
    expected = 2 * (p - 1) * (specs.efa_latency_s + n / (2 * p) / efa_Bps)
    assert run(net, "all_reduce", range(p), n) == pytest.approx(expected, rel=0.01)


def test_send_and_single_rank_group(specs: Any) -> None:
    topo = build_topology(specs.instance(), specs.chip(), 1)
    env = simpy.Environment()
    net = Network(env, topo, range(16))
    done = net.send(0, 2, 1e6)  # two hops along x
    env.run(until=done)
    assert env.now == pytest.approx(2 * specs.link_latency_s + 1e6 / specs.link_Bps)
    assert run(net, "all_reduce", [5], 1e9) == 0.0


def test_ranks_on_one_chip_use_its_local_link(specs: Any) -> None:
    topo = build_topology(specs.instance(), specs.chip(), 1)
    env = simpy.Environment()
    net = Network(env, topo, [r // 4 for r in range(64)], {"all_reduce": "ring_uni"})
    t = run(net, "all_reduce", range(4), 4e6)  # four ranks on chip 0
    assert t == pytest.approx(6 * 1e6 / specs.dma_Bps * 4)  # 4 flows share the DMA link
    t64 = run(net, "all_reduce", range(64), 64e6)
    assert t64 > 0
    assert net.flows.link_bytes[topo.local_link(3)] > 0


def test_concurrent_collectives_on_disjoint_chips_do_not_interfere(specs: Any) -> None:
    topo = build_topology(specs.instance(), specs.chip(), 1)
    env = simpy.Environment()
    net = Network(env, topo, range(16))
    a = net.collective("all_reduce", range(8), 8e6)
    b = net.collective("all_reduce", range(8, 16), 8e6)
    env.run(until=env.all_of([a, b]))
    alone = Network(simpy.Environment(), topo, range(16))
    assert env.now == pytest.approx(run(alone, "all_reduce", range(8), 8e6), rel=1e-9)


def test_replicas_move_with_the_group_as_one_coflow(specs: Any) -> None:
    topo = build_topology(specs.instance(), specs.chip(), 2)
    # two groups sharing the fabric: one rank of each on every chip
    rows = np.asarray([range(0, 64, 2), range(1, 64, 2)])
    placed = [r // 2 for r in range(64)]
    env = simpy.Environment()
    both = Network(env, topo, placed)
    events = [both.collective("all_reduce", row.tolist(), 64e6) for row in rows]
    env.run(until=env.all_of(events))
    folded = Network(simpy.Environment(), topo, placed)
    done = folded.collective("all_reduce", rows[0].tolist(), 64e6, replicas=rows)
    folded.env.run(until=done)
    assert folded.env.now == pytest.approx(float(env.now), rel=0.01)
    alone = run(Network(simpy.Environment(), topo, placed), "all_reduce", rows[0], 64e6)
    assert folded.env.now > alone
    # sends: two pairs that share chip 0's EFA up link take twice as long as one
    env = simpy.Environment()
    net = Network(env, topo, [r // 2 for r in range(64)])
    pairs = np.asarray([[0, 32], [1, 34]])
    env.run(until=net.send(0, 32, 1e6, replicas=pairs))
    assert env.now == pytest.approx(specs.efa_latency_s + 2e6 / (specs.efa_Bps / 16), rel=0.01)
    with pytest.raises(SimulationError, match="rows of 2 ranks"):
        net.send(0, 32, 1e6, replicas=np.asarray([0, 32]))


@pytest.mark.parametrize("op", ["all_reduce", "all_to_all"])
def test_private_fabric_takes_host_links_without_routing(
    specs: Any, op: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the nonblocking fabric a flow between domains is its chips' two EFA links: the
    folded step built from them equals the one built by routing every flow."""
    from clustersim.network.fabric import TreeFabric

    topo = build_topology(specs.instance(), specs.chip(), 8)
    assert topo.scaleout is not None and topo.scaleout.private
    rows = np.arange(128).reshape(16, 8).T  # 8 groups of 16 ranks, one chip per instance
    groups = []
    for private in (True, False):
        monkeypatch.setattr(TreeFabric, "private", private)
        net = Network(simpy.Environment(), topo, range(128))
        groups.append(
            [g for g, _, _ in net._plan(op, tuple(rows[0].tolist()), 64e6, replicas=rows)]
        )
    for fast, routed in zip(*groups, strict=True):
        # Routed, the entity keeps every link of the representative's domains' chips;
        # taken directly, those of the representative's own flows: the same loads there,
        # and its other links are images just as loaded.
        at = np.searchsorted(routed.links, fast.links)
        np.testing.assert_array_equal(routed.links[at], fast.links)
        np.testing.assert_array_equal(routed.counts[at], fast.counts)
        assert routed.counts.max() == fast.counts.max()
        assert (fast.n_flows, fast.latency_s) == (routed.n_flows, routed.latency_s)


def test_partitioned_group_raises_at_the_call() -> None:
    topo = Topology("pair", chips_per_instance=3, local_bw_Bps=1e9)
    topo.add_duplex(chip_node(0), chip_node(1), capacity_Bps=1e9, latency_s=0.0, kind="neuronlink")
    net = Network(simpy.Environment(), topo, [0, 1, 2], {"all_gather": "ring_uni"})
    with pytest.raises(PartitionError, match="chip 1 cannot reach chip 2"):
        net.collective("all_gather", [0, 1, 2], 3.0)
    with pytest.raises(PartitionError):
        net.send(2, 0, 1.0)


def test_catalog_trn2_all_reduce_runs() -> None:
    inst, chip = catalog.instance("trn2.48xlarge"), catalog.chip("trn2")
    topo = build_topology(inst, chip, 1)
    net = Network(simpy.Environment(), topo, [r // 4 for r in range(64)])
    assert net.algorithm_for("all_reduce", range(0, 64, 4), 256e6) == "torus"
    t = run(net, "all_reduce", range(0, 64, 4), 256e6)
    busbw = 256e6 / t * 2 * 15 / 16
    link = inst.fabric.link_bw_Bps  # the bidirectional ring uses both directions of each link
    assert link < busbw < 2 * link


def test_public_api() -> None:
    for name in network_pkg.__all__:
        assert hasattr(network_pkg, name), name
    assert {"Network", "Topology", "FlowNetwork", "build_topology", "GroupInfo"} <= set(
        network_pkg.__all__
    )
