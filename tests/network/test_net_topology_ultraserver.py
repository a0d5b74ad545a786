"""UltraServer fabrics: the Trn2 3D torus, the Trn3 NeuronSwitch tier and GB200 NVL72."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import simpy
from simpy_helpers import finish_times

from clustersim import catalog
from clustersim.catalog.schema import InstanceSpec
from clustersim.errors import ScenarioError
from clustersim.network.fabric import Topology, build_topology, chip_node
from clustersim.network.flows import FlowNetwork


def build(name: str, count: int) -> tuple[InstanceSpec, float, Topology]:
    inst = catalog.instance(name)
    chip = catalog.chip(inst.chip)
    return inst, chip.calibration.link_efficiency, build_topology(inst, chip, count)


def torus_distance(a: tuple[int, ...], b: tuple[int, ...], dims: tuple[int, ...]) -> int:
    return sum(min((x - y) % n, (y - x) % n) for x, y, n in zip(a, b, dims, strict=True))


# -- Trn2 UltraServer: 4x4x4 torus ------------------------------------------------------------


def test_trn2_ultraserver_is_a_4x4x4_torus() -> None:
    inst, eff, topo = build("trn2u.48xlarge", 4)
    us = inst.ultraserver
    assert us is not None
    assert (topo.n_chips, topo.n_domains, topo.torus_dims) == (64, 1, (4, 4, 4))
    assert topo.n_links == 64 + 64 * 6  # local links, then 6 neighbours per chip; no EFA
    coords = [tuple(int(x) for x in c) for c in topo.chip_coords]  # type: ignore[union-attr]
    assert sorted(coords) == sorted(itertools.product(range(4), repeat=3))
    assert [c[2] for c in coords] == [c // 16 for c in range(64)]  # z is the instance
    kinds, caps, lats = topo.kinds, topo.capacity_Bps, topo.latency_s
    for link in np.flatnonzero(kinds == "neuronlink").tolist():
        (_, a), (_, b) = topo.endpoints(link)
        ca, cb = coords[int(a)], coords[int(b)]
        diff = [axis for axis in range(3) if ca[axis] != cb[axis]]
        assert len(diff) == 1 and torus_distance(ca, cb, (4, 4, 4)) == 1
        z = diff == [2]
        expected_Bps = (us.link_bw_Bps if z else inst.fabric.link_bw_Bps) * eff
        assert caps[link] == pytest.approx(expected_Bps)
        assert lats[link] == (us.link_latency_s if z else inst.fabric.link_latency_s)
    # Chips at the same (x, y) in the four instances form a Z ring.
    for chip in range(16):
        ring = [chip + 16 * z for z in range(4)]
        for a, b in itertools.pairwise([*ring, ring[0]]):
            assert len(topo.route(a, b)) == 1
            assert len(topo.route(b, a)) == 1


def test_trn2_ultraserver_routes_are_dimension_ordered_and_shortest() -> None:
    _, _, topo = build("trn2u.48xlarge", 4)
    coords = [tuple(int(x) for x in c) for c in topo.chip_coords]  # type: ignore[union-attr]
    for src, dst in itertools.product(range(64), repeat=2):
        if src == dst:
            continue
        route = topo.route(src, dst)
        assert len(route) == torus_distance(coords[src], coords[dst], (4, 4, 4))
        hops = [topo.endpoints(link) for link in route]
        assert hops[0][0] == chip_node(src) and hops[-1][1] == chip_node(dst)
        axes = []
        for (_, a), (_, b) in hops:
            ca, cb = coords[int(a)], coords[int(b)]
            axes.append(next(axis for axis in range(3) if ca[axis] != cb[axis]))
        assert axes == sorted(axes)  # x, then y, then z


@pytest.mark.parametrize("nbytes", [1e5, 64e6])
def test_ring_all_reduce_over_the_z_ring_matches_alpha_beta(nbytes: float) -> None:
    inst, eff, topo = build("trn2u.48xlarge", 4)
    us = inst.ultraserver
    assert us is not None
    a, b = us.link_latency_s, 1 / (us.link_bw_Bps * eff)
    p, chip = 4, 5
    ring = [chip + 16 * z for z in range(p)]
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    group = net.group([(ring[i], ring[(i + 1) % p]) for i in range(p)])
    assert group.latency_s == pytest.approx(a)
    # A ring all-reduce is 2(p-1) rounds of n/p per flow: one fluid transfer of the sum.
    rounds = 2 * (p - 1)
    (t,) = finish_times(env, [net.transfer_group(group, rounds * nbytes / p, rounds * a)])
    assert t == pytest.approx(2 * (p - 1) * a + 2 * (p - 1) / p * nbytes * b, rel=1e-9)


def test_ring_all_reduce_over_the_z_ring_is_not_slowed_by_its_reverse() -> None:
    inst, eff, topo = build("trn2u.48xlarge", 4)
    us = inst.ultraserver
    assert us is not None
    ring = [3 + 16 * z for z in range(4)]
    fwd_pairs = [(ring[i], ring[(i + 1) % 4]) for i in range(4)]
    rev_pairs = [(d, s) for s, d in fwd_pairs]
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    times = finish_times(
        env, [net.transfer(fwd_pairs, 1e6, 0.0), net.transfer(rev_pairs, 1e6, 0.0)]
    )
    assert times == pytest.approx([1e6 / (us.link_bw_Bps * eff)] * 2, rel=1e-9)


def test_trn2_ultraservers_are_joined_by_efa() -> None:
    inst, _, topo = build("trn2u.48xlarge", 8)
    assert (topo.n_domains, topo.chips_per_domain) == (2, 64)
    inside = topo.route(0, 63)  # instances 0 and 3 of one UltraServer: NeuronLink only
    assert set(topo.kinds[list(inside)]) == {"neuronlink"}
    across = topo.route(0, 64)
    assert [topo.kinds[link] for link in across] == ["efa", "efa"]
    efa_eff = catalog.chip(inst.chip).efa_link_efficiency
    assert topo.capacity_Bps[across[0]] == pytest.approx(inst.efa.bandwidth_Bps / 16 * efa_eff)
    assert topo.route_latency_s(across) == pytest.approx(inst.efa.latency_s)


@pytest.mark.parametrize(("name", "bad"), [("trn2u.48xlarge", 6), ("trn3-ultraserver-node", 4)])
def test_count_must_fill_whole_ultraservers(name: str, bad: int) -> None:
    inst = catalog.instance(name)
    assert inst.ultraserver is not None
    with pytest.raises(ScenarioError) as info:
        build_topology(inst, catalog.chip(inst.chip), bad)
    assert info.value.path == "cluster.count"
    assert f"multiple of {inst.ultraserver.instances}" in str(info.value)


def test_trn2_ultraserver_link_down_reroutes() -> None:
    inst, _, topo = build("trn2u.48xlarge", 4)
    (z_link,) = topo.route(0, 16)
    topo.set_link_state(z_link, "down")
    detour = topo.route(0, 16)
    assert z_link not in detour
    assert len(detour) == 3  # across in x or y, up the Z ring there, and back
    us = inst.ultraserver
    assert us is not None
    assert topo.route_latency_s(detour) == pytest.approx(
        2 * inst.fabric.link_latency_s + us.link_latency_s
    )


def test_torus_placement_is_exposed_for_collective_algorithms() -> None:
    _, _, topo = build("trn2u.48xlarge", 8)
    node = topo.graph.nodes[chip_node(70)]
    assert node["domain"] == 1
    assert node["coords"] == tuple(int(x) for x in topo.chip_coords[70])  # type: ignore[index]
    assert topo.graph.graph["torus_dims"] == (4, 4, 4)
    _, _, plain = build("trn2.48xlarge", 2)
    assert plain.torus_dims == (4, 4)
    assert plain.graph.nodes[chip_node(17)]["domain"] == 1


# -- Trn3 Gen2 UltraServer: NeuronSwitch ------------------------------------------------------


def test_trn3_ultraserver_neuronswitch_tier() -> None:
    inst, eff, topo = build("trn3-ultraserver-node", 36)
    us = inst.ultraserver
    assert us is not None
    assert (topo.n_chips, topo.n_domains) == (144, 1)
    same = topo.route(0, 3)
    assert [topo.endpoints(link) for link in same] == [
        (chip_node(0), ("switch", 0)),
        (("switch", 0), chip_node(3)),
    ]
    assert topo.capacity_Bps[same[0]] == pytest.approx(inst.fabric.link_bw_Bps * eff)
    across = topo.route(1, 140)
    nodes = [topo.endpoints(link)[1] for link in across]
    assert nodes[0] == ("switch", 0) and nodes[2] == ("switch", 35) and nodes[3] == chip_node(140)
    assert nodes[1] in (("nlspine", 0, 0), ("nlspine", 0, 1))
    # Two spines carry the four chips of a server at their full NeuronLink bandwidth.
    assert topo.capacity_Bps[across[1]] == pytest.approx(4 * us.link_bw_Bps * eff / 2)
    spines = [topo.endpoints(topo.route(0, 140 + c)[1])[1] for c in range(4)]
    assert spines[0] != spines[1] and spines[0] == spines[2]  # ECMP alternates the spines


def any_to_any(topo: Topology, domain: int, nbytes: float) -> tuple[list[float], float]:
    """Times of a shift permutation (separate transfers) and of an all-to-all coflow."""
    n = topo.chips_per_domain
    per = topo.chips_per_instance
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    base = domain * n
    shift = [net.transfer([(base + c, base + (c + per) % n)], nbytes, 0.0) for c in range(n)]
    times = finish_times(env, shift)
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    pairs = [(base + s, base + d) for s in range(n) for d in range(n) if s != d]
    (t_all,) = finish_times(env, [net.transfer(pairs, nbytes, 0.0)])
    return times, t_all


def test_trn3_any_to_any_at_full_neuronlink_bandwidth() -> None:
    inst, eff, topo = build("trn3-ultraserver-node", 36)
    cap = inst.fabric.link_bw_Bps * eff
    times, t_all = any_to_any(topo, 0, 1e6)
    assert times == pytest.approx([1e6 / cap] * 144, rel=1e-9)  # every chip to the next server
    assert t_all == pytest.approx(143 * 1e6 / cap, rel=1e-9)  # bound by each chip's own link


def test_gb200_nvl72_any_to_any_at_full_nvlink_bandwidth() -> None:
    inst, eff, topo = build("gb200-nvl72-node", 36)
    us = inst.ultraserver
    assert us is not None
    assert (inst.chip, inst.chips, us.instances, us.topology) == ("gb200", 4, 18, "nvl72")
    assert us.link_bw_Bps == pytest.approx(900e9)
    assert (topo.n_chips, topo.n_domains, topo.chips_per_domain) == (144, 2, 72)
    cap = us.link_bw_Bps * eff
    for src, dst in [(0, 1), (0, 71), (5, 40)]:  # same tray or not: through the switch tier
        route = topo.route(src, dst)
        assert [topo.endpoints(link)[1] for link in route] == [("nvlswitch", 0), chip_node(dst)]
        assert topo.route_latency_s(route) == pytest.approx(us.link_latency_s)
    times, t_all = any_to_any(topo, 1, 1e6)
    assert times == pytest.approx([1e6 / cap] * 72, rel=1e-9)
    assert t_all == pytest.approx(71 * 1e6 / cap, rel=1e-9)
    assert [topo.kinds[link] for link in topo.route(0, 72)] == ["efa", "efa"]
