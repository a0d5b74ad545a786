"""Every collective algorithm against its alpha-beta closed form, on uncontended topologies.

Latency ``a`` is a route's latency (one hop on a ring or torus; chip-switch-chip
through a switch) and ``b = 1 / capacity`` per direction of a link. The synthetic
topologies are cached across tests: no test changes their link state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np
import pytest
import simpy

from clustersim import catalog
from clustersim.network import GroupInfo, Network, resolve_algorithm
from clustersim.network.collectives import Step, parallel_steps, phase_algorithm
from clustersim.network.fabric import (
    Node,
    Topology,
    add_torus_links,
    build_topology,
    chip_node,
    torus_path,
)

CAP = 50e9
LAT = 1e-6
B = 1 / CAP
KIB, MIB, GIB = 2.0**10, 2.0**20, 2.0**30
SIZES = [KIB, MIB, GIB]


def run(net: Network, op: str, ranks: Sequence[int], nbytes: float) -> float:
    env = net.env
    start = env.now
    env.run(until=net.collective(op, ranks, nbytes))
    return float(env.now - start)


def timed(
    topo: Topology, alg: str, op: str, nbytes: float, ranks: Sequence[int] | None = None
) -> float:
    """Time of ``op`` with algorithm ``alg`` over ``ranks`` (default: one rank per chip, all)."""
    group = list(range(topo.n_chips)) if ranks is None else list(ranks)
    net = Network(simpy.Environment(), topo, range(topo.n_chips), {op: alg})
    return run(net, op, group, nbytes)


# -- synthetic topologies -------------------------------------------------------------------------


@cache
def duplex_ring(p: int) -> Topology:
    topo = Topology(f"ring{p}", chips_per_instance=p, local_bw_Bps=1e13)
    chips = np.arange(p if p > 2 else 1)
    topo.add_duplex_links(
        chips, (chips + 1) % p, capacity_Bps=CAP, latency_s=LAT, kind="neuronlink"
    )
    return topo


@cache
def star(p: int) -> Topology:
    """One domain of ``p`` chips on a non-blocking switch (one up and one down link each)."""
    topo = Topology(f"star{p}", chips_per_instance=p, local_bw_Bps=1e13)
    (hub,) = topo.add_nodes([("switch", 0)])
    chips = np.arange(p)
    topo.add_duplex_links(
        chips, np.full(p, hub), capacity_Bps=CAP, latency_s=LAT / 2, kind="switch"
    )
    topo.path_fn = lambda s, d: (s, hub, d)
    return topo


@cache
def torus(dims: tuple[int, ...]) -> Topology:
    """A torus of chips numbered in row-major order (axis 0 fastest), coordinates recorded."""
    coords = [
        tuple((i // math.prod(dims[:k])) % dims[k] for k in range(len(dims)))
        for i in range(math.prod(dims))
    ]
    index = {c: i for i, c in enumerate(coords)}
    topo = Topology(f"torus{dims}", chips_per_instance=len(coords), local_bw_Bps=1e13)
    nodes: dict[tuple[int, ...], Node] = {c: chip_node(i) for i, c in enumerate(coords)}
    add_torus_links(topo, nodes, dims, capacity_Bps=CAP, latency_s=LAT, lanes=1)
    topo.set_chip_coords(coords, dims)
    topo.path_fn = lambda s, d: [index[c] for c in torus_path(coords[s], coords[d], dims)]
    return topo


# -- closed forms ---------------------------------------------------------------------------------


def ring_duplex_form(op: str, p: int, n: float) -> float:
    """Bidirectional ring on a duplex ring: each half a one-way ring on n/2 (p = 2: one-way)."""
    h = 2 if p > 2 else 1
    if op == "all_reduce":
        return 2 * (p - 1) * LAT + 2 * (p - 1) / p * n * B / h
    if op in ("reduce_scatter", "all_gather"):
        return (p - 1) * LAT + (p - 1) / p * n * B / h
    return (p - 1) * LAT + n * B / h  # broadcast, reduce: pipelined chains


def ring_uni_form(op: str, p: int, n: float) -> float:
    if op == "all_reduce":
        return 2 * (p - 1) * LAT + 2 * (p - 1) / p * n * B
    if op in ("reduce_scatter", "all_gather"):
        return (p - 1) * LAT + (p - 1) / p * n * B
    return (p - 1) * LAT + n * B


def star_form(alg: str, op: str, p: int, n: float, *, a: float = LAT, b: float = B) -> float:
    """Algorithms on a non-blocking switch: each chip one up and one down link."""
    log = math.log2(p)
    k = math.ceil(log)
    frac = (p - 1) / p * n * b
    phases = 2 if op == "all_reduce" else 1
    if alg in ("ring", "ring_uni"):  # both ways share a chip's one up link
        return phases * (p - 1) * a + phases * frac
    if alg == "halving_doubling":
        return phases * (log * a + frac)
    if alg == "mesh":
        if op in ("broadcast", "reduce"):
            return a + (p - 1) * n * b
        return phases * (a + frac)
    if alg == "pairwise":
        return (p - 1) * a + frac
    if alg == "tree":
        return phases * k * (a + n * b)
    raise AssertionError(alg)


def torus_form(op: str, dims: Sequence[int], n: float) -> float:
    """Dimension-ordered bidirectional rings; one phase per axis of size >= 2."""
    t, m = 0.0, n
    for d in dims:
        if d < 2:
            continue
        t += (d - 1) * LAT + (d - 1) / d * m * B / (2 if d > 2 else 1)
        m /= d
    return 2 * t if op == "all_reduce" else t


# -- oracles --------------------------------------------------------------------------------------

P_VALUES = [4, 8, 64, 1024]
RING_OPS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"]


@pytest.mark.parametrize("p", [3, *P_VALUES])
@pytest.mark.parametrize("n", SIZES)
def test_bidirectional_ring_on_a_duplex_ring(p: int, n: float) -> None:
    topo = duplex_ring(p)
    for op in RING_OPS:
        assert timed(topo, "ring", op, n) == pytest.approx(ring_duplex_form(op, p, n), rel=0.01)


@pytest.mark.parametrize("p", [2, 5, 64])
def test_one_way_ring_on_a_duplex_ring(p: int) -> None:
    topo = duplex_ring(p)
    for op in RING_OPS:
        assert timed(topo, "ring_uni", op, MIB) == pytest.approx(
            ring_uni_form(op, p, MIB), rel=0.01
        )
    if p > 2:  # halving the buffer each way halves the bandwidth term
        assert timed(topo, "ring", "all_reduce", GIB) < 0.51 * timed(
            topo, "ring_uni", "all_reduce", GIB
        )


@pytest.mark.parametrize("p", P_VALUES)
@pytest.mark.parametrize("n", SIZES)
def test_switch_algorithms(p: int, n: float) -> None:
    topo = star(p)
    cases: dict[str, list[str]] = {
        "ring": ["all_reduce", "reduce_scatter", "all_gather"],
        "halving_doubling": ["all_reduce", "reduce_scatter", "all_gather"],
        "tree": ["all_reduce", "broadcast", "reduce"],
    }
    if p <= 64:  # p(p-1) flows per step
        cases["mesh"] = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast"]
        cases["pairwise"] = ["all_to_all"]
    for alg, ops in cases.items():
        for op in ops:
            expected = star_form(alg, op, p, n)
            assert timed(topo, alg, op, n) == pytest.approx(expected, rel=0.01), (alg, op)


@pytest.mark.parametrize("p", [3, 5, 100])
def test_tree_on_any_group_size(p: int) -> None:
    topo = star(p)
    for op in ("all_reduce", "broadcast", "reduce"):
        assert timed(topo, "tree", op, MIB) == pytest.approx(
            star_form("tree", op, p, MIB), rel=0.01
        )


def test_halving_doubling_falls_back_to_ring_off_powers_of_two() -> None:
    topo = star(6)
    assert resolve_algorithm("halving_doubling", "all_reduce", 6, MIB) == "ring"
    assert timed(topo, "halving_doubling", "all_reduce", MIB) == pytest.approx(
        star_form("ring", "all_reduce", 6, MIB), rel=0.01
    )


TORI = [(2, 2), (4, 2), (2, 2, 2), (8, 8), (4, 4, 4), (32, 32), (16, 8, 8)]


@pytest.mark.parametrize("dims", TORI, ids=lambda d: "x".join(map(str, d)))
@pytest.mark.parametrize("n", SIZES)
def test_torus_dimension_ordered_rings(dims: tuple[int, ...], n: float) -> None:
    topo = torus(dims)
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        assert timed(topo, "torus", op, n) == pytest.approx(torus_form(op, dims, n), rel=0.01)


def test_torus_beats_the_ring_on_latency_and_matches_its_bandwidth() -> None:
    topo = torus((4, 4, 4))
    small = timed(topo, "torus", "all_reduce", KIB)
    assert small == pytest.approx(2 * 9 * LAT, rel=0.05)
    big_torus = timed(topo, "torus", "all_reduce", GIB)
    ring_alone = ring_duplex_form("all_reduce", 64, GIB)  # the 64-chip ring, if uncontended
    assert big_torus == pytest.approx(ring_alone - 2 * (63 - 9) * LAT, rel=0.01)


def test_torus_on_a_sub_grid_and_with_ranks_sharing_chips() -> None:
    topo = torus((4, 4))
    # chips 0..7: rows y = 0, 1 of the 4x4 torus: a 4 x 2 grid
    assert timed(topo, "torus", "all_reduce", GIB, range(8)) == pytest.approx(
        torus_form("all_reduce", (4, 2), GIB), rel=0.01
    )
    # two ranks per chip: the on-chip axis comes first, over the chip's local link
    env = simpy.Environment()
    net = Network(env, topo, [r // 2 for r in range(32)], {"all_reduce": "torus"})
    info = net.group_info(range(32))
    assert info.chip[:4] == (0, 0, 1, 1)
    t = run(net, "all_reduce", range(32), GIB)
    local = 2 * GIB / 1e13  # reduce-scatter + all-gather: 2 flows of n/2 on the local link
    # then each rank's n/2 shard crosses the torus, its chip's two lines sharing the links:
    # the same bytes per link as one rank per chip with n
    assert t == pytest.approx(local + torus_form("all_reduce", (4, 4), GIB), rel=0.01)


def test_torus_falls_back_to_ring_without_a_grid() -> None:
    topo = star(8)
    assert resolve_algorithm("torus", "all_reduce", 8, MIB) == "ring"
    info = GroupInfo.of(range(3), [0] * 3, [(0, 0), (1, 0), (0, 1)], (2, 2))
    assert resolve_algorithm("torus", "all_gather", 3, MIB, info) == "ring"
    assert timed(topo, "torus", "all_gather", MIB) == pytest.approx(
        star_form("ring", "all_gather", 8, MIB), rel=0.01
    )


# -- hierarchical ---------------------------------------------------------------------------------


def test_parallel_steps_run_each_step_in_every_group_in_turn() -> None:
    steps = [Step(((0, 1), (1, 0)), 2.0, 3), Step(((1, 0),), 1.0)]
    assert parallel_steps(steps, [[5, 6], [7, 8]]) == [
        Step(((5, 6), (6, 5), (7, 8), (8, 7)), 2.0, 3),
        Step(((6, 5), (8, 7)), 1.0),
    ]
    assert parallel_steps(steps, []) == [Step((), 2.0, 3), Step((), 1.0)]


def hierarchical_form(specs: Any, op: str, domains: int, local: int, n: float) -> float:
    """Sum of the phases' closed forms: inside on the instance switch, across on EFA."""

    def phase(sub_op: str, q: int, m: float, a: float, b: float, *, inside: bool) -> float:
        alg = phase_algorithm(sub_op, q, m, inside=inside)
        return star_form(alg, sub_op, q, m, a=a, b=b)

    a1, b1 = specs.link_latency_s, 1 / specs.link_Bps
    a2, b2 = specs.efa_latency_s, local / specs.efa_Bps  # a chip's share of the NICs
    shard = n / local
    rs, ag = (phase(o, local, n, a1, b1, inside=True) for o in ("reduce_scatter", "all_gather"))
    if op == "all_reduce":
        return rs + ag + phase("all_reduce", domains, shard, a2, b2, inside=False)
    if op == "reduce_scatter":
        return rs + phase(op, domains, shard, a2, b2, inside=False)
    return phase(op, domains, shard, a2, b2, inside=False) + ag


_SWITCHED: dict[tuple[int, int], Topology] = {}


@pytest.mark.parametrize(("domains", "local"), [(2, 2), (2, 4), (4, 16), (64, 16)])
@pytest.mark.parametrize("n", SIZES)
def test_hierarchical_on_switch_instances(specs: Any, domains: int, local: int, n: float) -> None:
    topo = _SWITCHED.get((domains, local))
    if topo is None:
        inst = specs.instance("switch", dims=(), chips=local)
        topo = _SWITCHED[(domains, local)] = build_topology(inst, specs.chip(), domains)
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        expected = hierarchical_form(specs, op, domains, local, n)
        assert timed(topo, "hierarchical", op, n) == pytest.approx(expected, rel=0.01), op


def test_hierarchical_beats_a_flat_ring_across_instances(specs: Any) -> None:
    topo = build_topology(specs.instance(), specs.chip(), 4)  # 4 x 16-chip 2D tori, EFA
    net = Network(simpy.Environment(), topo, range(64))
    assert net.algorithm_for("all_reduce", range(64), GIB) == "hierarchical"
    hier = timed(topo, "hierarchical", "all_reduce", GIB)
    flat = timed(topo, "ring", "all_reduce", GIB)
    assert hier < 0.5 * flat
    # flat: the ring crosses EFA 4 times each way; each crossing carries n/(2p) a round
    efa_b = 16 / specs.efa_Bps
    assert flat == pytest.approx(2 * 63 * (specs.efa_latency_s + GIB / 128 * efa_b), rel=0.01)


def test_hierarchical_falls_back_to_ring_in_one_domain(specs: Any) -> None:
    topo = build_topology(specs.instance(), specs.chip(), 2)
    net = Network(simpy.Environment(), topo, range(32), {"all_reduce": "hierarchical"})
    assert net.algorithm_for("all_reduce", range(16), GIB) == "ring"
    assert net.algorithm_for("all_reduce", range(32), GIB) == "hierarchical"
    assert net.algorithm_for("all_reduce", [*range(16), 16], GIB) == "ring"  # uneven


def test_torus_on_the_trn2_ultraserver_3d_torus() -> None:
    inst, chip = catalog.instance("trn2u.48xlarge"), catalog.chip("trn2")
    assert inst.ultraserver is not None
    topo = build_topology(inst, chip, 4)  # one UltraServer: 4 x 4 x 4, z across instances
    eff = chip.calibration.link_efficiency
    a_xy, b_xy = inst.fabric.link_latency_s, 1 / (inst.fabric.link_bw_Bps * eff)
    a_z, b_z = inst.ultraserver.link_latency_s, 1 / (inst.ultraserver.link_bw_Bps * eff)
    net = Network(simpy.Environment(), topo, range(64), {"all_reduce": "torus"})
    phases = [(a_xy, b_xy, GIB), (a_xy, b_xy, GIB / 4), (a_z, b_z, GIB / 16)]
    expected = 2 * sum(3 * a + 3 / 4 * m * b / 2 for a, b, m in phases)
    assert run(net, "all_reduce", range(64), GIB) == pytest.approx(expected, rel=0.01)


def test_torus_on_the_catalog_2d_torus(specs: Any) -> None:
    topo = build_topology(specs.instance(), specs.chip(), 1)  # chips along a snake
    net = Network(simpy.Environment(), topo, range(16), {"all_reduce": "torus"})
    assert net.algorithm_for("all_reduce", range(16), GIB) == "torus"
    b = 1 / specs.link_Bps
    a = specs.link_latency_s
    expected = 2 * (3 * a + 3 / 4 * GIB * b / 2 + 3 * a + 3 / 16 * GIB * b / 2)
    assert run(net, "all_reduce", range(16), GIB) == pytest.approx(expected, rel=0.01)
