"""Topology builders, snake placement, dimension-order routing and link state."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from clustersim import catalog
from clustersim.errors import PartitionError, ScenarioError, SimulationError
from clustersim.network.fabric import build_topology, snake_coords, topology_names, torus_path
from clustersim.network.fabric._column import Column
from clustersim.network.fabric.routes import row_sums
from clustersim.network.fabric.topology import EFA_NODE, Topology, chip_node


def torus_neighbours(a: tuple[int, int], b: tuple[int, int], dims: tuple[int, int]) -> bool:
    dx = (a[0] - b[0]) % dims[0]
    dy = (a[1] - b[1]) % dims[1]
    return (dx in (1, dims[0] - 1) and dy == 0) or (dy in (1, dims[1] - 1) and dx == 0)


@pytest.mark.parametrize("dims", [(4, 4), (4, 2), (3, 2), (2, 4), (8, 4)])
def test_snake_is_a_hamiltonian_cycle(dims: tuple[int, int]) -> None:
    coords = snake_coords(dims)
    assert sorted(coords) == sorted(itertools.product(range(dims[0]), range(dims[1])))
    for a, b in itertools.pairwise([*coords, coords[0]]):
        assert torus_neighbours(a, b, dims), (a, b)


def test_torus_path_is_dimension_ordered_shortest_and_ties_split_by_parity() -> None:
    dims = (4, 4)
    assert torus_path((0, 0), (3, 0), dims) == [(0, 0), (3, 0)]  # wrap-around
    assert torus_path((0, 0), (2, 0), dims) == [(0, 0), (1, 0), (2, 0)]  # tie, even: positive
    assert torus_path((1, 0), (3, 0), dims) == [(1, 0), (0, 0), (3, 0)]  # tie, odd: negative
    assert torus_path((0, 1), (0, 3), dims) == [(0, 1), (0, 0), (0, 3)]  # on y, by y's parity
    assert torus_path((1, 1), (3, 0), dims) == [(1, 1), (0, 1), (3, 1), (3, 0)]  # x then y
    assert torus_path((2, 2), (2, 2), dims) == [(2, 2)]


def test_trn2_torus_from_the_catalog(specs: Any) -> None:
    inst, chip = catalog.instance("trn2.48xlarge"), catalog.chip("trn2")
    topo = build_topology(inst, chip, 1)
    assert topo.n_chips == 16
    assert topo.n_links == 16 + 16 * 4  # local links, then 4 neighbours per chip
    eff = chip.calibration.link_efficiency
    one_hop = topo.route(0, 1)
    assert len(one_hop) == 1
    assert topo.capacity_Bps[one_hop[0]] == pytest.approx(inst.fabric.link_bw_Bps * eff)
    assert topo.route_latency_s(one_hop) == pytest.approx(inst.fabric.link_latency_s)
    # The snake makes every consecutive pair, and the last chip and chip 0, neighbours.
    for c in range(16):
        assert len(topo.route(c, (c + 1) % 16)) == 1
    assert topo.names[one_hop[0]] == "chip0->chip1"

    two = build_topology(inst, chip, 2)
    assert two.n_links == 2 * 80 + 2 * 32
    cross = two.route(3, 16 + 5)
    assert [two.endpoints(link) for link in cross] == [
        (chip_node(3), EFA_NODE),
        (EFA_NODE, chip_node(21)),
    ]
    # EFA links carry the collectives' sustained fraction of the NIC rate
    efa_eff = chip.efa_link_efficiency
    assert two.capacity_Bps[cross[0]] == pytest.approx(inst.efa.bandwidth_Bps / 16 * efa_eff)
    assert two.route_latency_s(cross) == pytest.approx(inst.efa.latency_s)


def test_every_catalog_instance_builds() -> None:
    for name in catalog.names("instances"):
        inst = catalog.instance(name)
        per_domain = inst.ultraserver.instances if inst.ultraserver else 1
        topo = build_topology(inst, catalog.chip(inst.chip), 2 * per_domain)
        assert topo.n_domains == 2
        last = topo.n_chips - 1
        for a, b in [(0, 1), (1, 0), (0, topo.chips_per_domain), (topo.chips_per_domain - 1, last)]:
            route = topo.route(a, b)
            assert topo.endpoints(route[0])[0] == chip_node(a)
            assert topo.endpoints(route[-1])[1] == chip_node(b)


def test_route_to_self_is_the_local_link(specs: Any) -> None:
    topo = build_topology(specs.instance(), specs.chip(), 1)
    (local,) = topo.route(5, 5)
    assert local == topo.local_link(5)
    assert topo.capacity_Bps[local] == specs.dma_Bps
    assert topo.latency_s[local] == 0.0


def test_routes_follow_torus_placement_and_are_cached(specs: Any) -> None:
    topo = build_topology(specs.instance(), specs.chip(), 1)
    coords = snake_coords((4, 4))
    local_of: dict[tuple[int, ...], int] = {c: i for i, c in enumerate(coords)}
    for src, dst in itertools.product(range(16), repeat=2):
        if src == dst:
            continue
        route = topo.route(src, dst)
        nodes = [chip_node(local_of[c]) for c in torus_path(coords[src], coords[dst], (4, 4))]
        assert [topo.endpoints(link) for link in route] == list(itertools.pairwise(nodes))
        assert topo.route(src, dst) is route


def test_switch_builder(specs: Any) -> None:
    inst = specs.instance("switch", dims=(), chips=8)
    topo = build_topology(inst, specs.chip(link_efficiency=0.5), 3)
    route = topo.route(2, 7)
    assert [topo.endpoints(link) for link in route] == [
        (chip_node(2), ("switch", 0)),
        (("switch", 0), chip_node(7)),
    ]
    assert topo.route_latency_s(route) == pytest.approx(specs.link_latency_s)
    assert topo.capacity_Bps[route[0]] == pytest.approx(specs.link_Bps * 0.5)
    assert len(topo.route(2, 9)) == 2  # through EFA
    assert topo.n_links == 24 + 3 * 16 + 24 * 2


def test_unknown_topology_lists_the_valid_names(specs: Any) -> None:
    with pytest.raises(ScenarioError) as info:
        build_topology(specs.instance("hypercube"), specs.chip(), 1)
    message = str(info.value)
    assert "cluster.neuronlink.topology" in message
    assert "hypercube" in message
    for name in topology_names():
        assert name in message
    assert {"switch", "torus2d"} <= set(topology_names())


def test_bad_torus_dims(specs: Any) -> None:
    with pytest.raises(ScenarioError, match="dims"):
        build_topology(specs.instance(dims=(4, 2)), specs.chip(), 1)


def test_lanes_scale_capacity_and_down_links_are_routed_around(specs: Any) -> None:
    topo = build_topology(specs.instance(lanes=4), specs.chip(), 1)
    (link,) = topo.route(0, 1)
    version = topo.version
    topo.set_lanes_up(link, 3)
    assert topo.state(link) == "degraded"
    assert topo.capacity_Bps[link] == pytest.approx(0.75 * specs.link_Bps)
    assert topo.graph.edges[topo.endpoints(link)]["state"] == "degraded"
    assert topo.route(0, 1) == (link,)  # a degraded link still carries traffic
    topo.set_link_state(link, "down")
    assert topo.version > version
    assert topo.capacity_Bps[link] == 0.0
    detour = topo.route(0, 1)
    assert link not in detour
    assert len(detour) == 3
    topo.set_link_state(link, "up")
    assert topo.route(0, 1) == (link,)


def test_cut_graph_raises_partition_error_naming_both_chips() -> None:
    topo = Topology("pair", chips_per_instance=3, local_bw_Bps=1e9)
    ab = topo.add_link(
        chip_node(0), chip_node(1), capacity_Bps=1e9, latency_s=1e-6, kind="neuronlink"
    )
    topo.add_link(chip_node(1), chip_node(0), capacity_Bps=1e9, latency_s=1e-6, kind="neuronlink")
    assert topo.route(0, 1) == (ab,)
    with pytest.raises(PartitionError, match=r"chip 0 cannot reach chip 2"):
        topo.route(0, 2)
    topo.set_link_state(ab, "down")
    with pytest.raises(PartitionError, match=r"chip 0 cannot reach chip 1"):
        topo.route(0, 1)


def test_nodes_keep_their_ids_and_new_ones_follow_in_order() -> None:
    topo = Topology("nodes", chips_per_instance=2, local_bw_Bps=1e9)
    assert topo.n_nodes == 2
    assert topo.add_nodes([("a",), ("b",)]).tolist() == [2, 3]
    assert topo.add_nodes(iter([("c",), ("a",), ("c",), chip_node(1)])).tolist() == [4, 2, 4, 1]
    assert topo.add_nodes([("d",), ("d",)]).tolist() == [5, 5]
    assert topo.add_nodes([]).tolist() == []
    assert [topo.node(i) for i in range(topo.n_nodes)] == [
        chip_node(0), chip_node(1), ("a",), ("b",), ("c",), ("d",)
    ]  # fmt: skip
    assert topo.node_id(("c",)) == 4


@pytest.mark.parametrize("size", [3, 100])  # a linear search of the tail, then runs
def test_duplicate_links_are_refused_whether_or_not_their_ends_have_links(size: int) -> None:
    """Links to nodes that have no link yet are not searched for among the others (they
    cannot repeat one); a batch with one that repeats a link is still refused."""
    topo = Topology("dups", chips_per_instance=2, local_bw_Bps=1e9)
    switches = topo.add_nodes([("s", i) for i in range(size)])
    chip = np.zeros(size, dtype=np.int64)
    up = topo.add_links(chip, switches, capacity_Bps=1e9, latency_s=0.0, kind="efa")
    down = topo.add_links(switches, chip, capacity_Bps=1e9, latency_s=0.0, kind="efa")
    more = topo.add_nodes([("t", i) for i in range(size)])
    for u, v in [(switches[:1], switches[-1:]), (more, chip)]:
        topo.add_links(u, v, capacity_Bps=1e9, latency_s=0.0, kind="efa")  # new: accepted
    fresh = topo.add_nodes([("u",)])  # its link is not searched for, the other one is
    mixed = (np.r_[fresh, more[:1]], chip[:2])
    for u, v in [(chip, switches), (switches[::-1], chip[::-1]), mixed]:
        with pytest.raises(SimulationError, match="duplicate link"):
            topo.add_links(u, v, capacity_Bps=1e9, latency_s=0.0, kind="efa")
    with pytest.raises(SimulationError, match="duplicate link"):  # repeated within the batch
        topo.add_links([1, 1], [more[0], more[0]], capacity_Bps=1e9, latency_s=0.0, kind="efa")
    assert topo.links_between(chip, switches).tolist() == up.tolist()
    assert topo.links_between(switches, chip).tolist() == down.tolist()


def test_a_column_reads_values_across_its_parts_as_its_joined_view() -> None:
    column = Column(np.int32)
    rng = np.random.default_rng(3)
    for size in (5, 0, 17, 1, 40):
        column.extend(rng.integers(0, 1000, size))
    at = rng.integers(0, column.n, 300)
    values = column.take(at)
    assert column._parts  # read without joining them
    assert values.dtype == np.int32 and values.tolist() == column.view[at].tolist()
    assert column.take(at).tolist() == values.tolist()  # joined now


def test_a_column_reads_indices_of_one_part_and_of_any_shape() -> None:
    column = Column(np.int64)
    for start in (0, 10, 30):
        column.extend(np.arange(start, start + (10 if start < 30 else 5)))
    assert column.take(np.asarray([[12, 19], [10, 11]])).tolist() == [[12, 19], [10, 11]]
    assert column.take(np.asarray([3, 24, 15])).tolist() == [3, 34, 15]
    with pytest.raises(IndexError):
        column.take(np.asarray([25]))


@pytest.mark.parametrize("columns", range(1, 10))
def test_route_latencies_arerow_sums_bit_for_bit(columns: int) -> None:
    values = np.random.default_rng(columns).random((1000, columns)) * 1e-5
    assert np.array_equal(row_sums(values), values.sum(axis=1))


def test_bulk_routes_agree_with_single_routes(specs: Any) -> None:
    topo = build_topology(specs.instance(), specs.chip(), 3)
    pairs = [(s, d) for s in range(0, 48, 5) for d in range(0, 48, 3)]

    def one_by_one() -> tuple[list[int], list[float]]:
        routes = [topo.route(s, d) for s, d in pairs]
        links = sorted(link for r in routes for link in r)
        return links, sorted(topo.route_latency_s(r) for r in routes)

    for _ in range(2):  # with the scale-out fast path, then with a link down
        flat, latency = topo.routes(pairs)
        links, latencies = one_by_one()
        src, dst = zip(*pairs, strict=True)
        same = topo.routes_between(np.asarray(src), np.asarray(dst))
        assert same[0].tolist() == flat.tolist() and same[1].tolist() == latency.tolist()
        assert sorted(flat.tolist()) == links
        assert sorted(latency.tolist()) == pytest.approx(latencies)
        topo.set_link_state(topo.route(5, 20)[0], "down")
    assert len(topo.route(5, 20)) == 3  # via a torus neighbour's EFA link
