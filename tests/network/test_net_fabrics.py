"""Scale-out fabrics: non-blocking, fat tree (Clos) and rail-optimised, with ECMP and failures."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import numpy as np
import pytest
import simpy
from simpy_helpers import finish_times

from clustersim import catalog
from clustersim.catalog.schema import EfaSpec, InstanceSpec
from clustersim.errors import PartitionError, ScenarioError
from clustersim.network.fabric import (
    EFA_NODE,
    SWITCH_HOP_LATENCY_S,
    Topology,
    TreeFabric,
    build_topology,
    chip_node,
    fabric_names,
    leaf_ports,
)
from clustersim.network.flows import FlowNetwork, link_counts
from clustersim.scenario import load_scenario

CHIP_EFA_BPS = 20e9  # the test instance: 320 GB/s of EFA over 16 chips, one NIC each


def with_efa(specs: Any, **efa: Any) -> InstanceSpec:
    inst: InstanceSpec = specs.instance()
    fields = {"bandwidth_Bps": specs.efa_Bps, "latency_s": specs.efa_latency_s, "nics": 16, **efa}
    return inst.model_copy(update={"efa": EfaSpec.model_validate(fields)})


def build(specs: Any, count: int, **efa: Any) -> Topology:
    return build_topology(with_efa(specs, **efa), specs.chip(), count)


def nodes_of(topo: Topology, route: tuple[int, ...]) -> list[Any]:
    return [topo.endpoints(route[0])[0], *(topo.endpoints(link)[1] for link in route)]


def spine_link_counts(topo: Topology, pairs: list[tuple[int, int]]) -> Counter[int]:
    """Flows on each leaf-to-spine link."""
    flat, _ = topo.routes(pairs)
    kind = np.asarray([str(topo.node(i)[0]) for i in range(topo.n_nodes)])
    up = (kind[topo.link_u] == "leaf") & (kind[topo.link_v] == "spine")
    return Counter(flat[up[flat]].tolist())


def test_nonblocking_is_the_default_and_unchanged(specs: Any) -> None:
    assert catalog.instance("trn2.48xlarge").efa.fabric == "nonblocking"
    topo = build(specs, 2)
    assert isinstance(topo.scaleout, TreeFabric)
    assert nodes_of(topo, topo.route(3, 21)) == [chip_node(3), EFA_NODE, chip_node(21)]
    assert {"nonblocking", "fat_tree", "clos", "rail"} <= set(fabric_names())


def test_fabric_names_are_checked(specs: Any) -> None:
    with pytest.raises(ScenarioError) as info:
        build(specs, 2, fabric="dragonfly")
    assert info.value.path == "cluster.efa.fabric"
    for name in fabric_names():
        assert name in str(info.value)


def test_fat_tree_ports_and_structure(specs: Any) -> None:
    efa = with_efa(specs, fabric="fat_tree", radix=48, oversubscription=2).efa
    assert leaf_ports(efa) == (32, 16)
    topo = build(specs, 4, fabric="fat_tree", radix=64)  # 32 chips (2 instances) per leaf
    fabric = topo.scaleout
    assert isinstance(fabric, TreeFabric)
    assert fabric.leaf_of.tolist() == [0] * 32 + [1] * 32
    assert nodes_of(topo, topo.route(5, 21)) == [chip_node(5), ("leaf", 0), chip_node(21)]
    across = topo.route(5, 37)
    hops = nodes_of(topo, across)
    assert hops[1] == ("leaf", 0) and hops[3] == ("leaf", 1) and hops[2][0] == "spine"
    lat = topo.route_latency_s(across)
    assert lat == pytest.approx(specs.efa_latency_s + 2 * SWITCH_HOP_LATENCY_S)
    # Non-blocking: a leaf's 32 uplinks carry what its 32 chips inject.
    assert topo.capacity_Bps[across[1]] == pytest.approx(CHIP_EFA_BPS)
    assert topo.capacity_Bps[across[0]] == pytest.approx(CHIP_EFA_BPS)


def cross_leaf_rates(specs: Any, radix: int, oversubscription: float) -> list[float]:
    """Every chip of leaf 0 sends to one of leaf 1 at once: each flow's throughput."""
    topo = build(
        specs, 4, fabric="fat_tree", radix=radix, oversubscription=oversubscription, tiers=2
    )
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    nbytes = 1e6
    times = finish_times(env, [net.transfer([(c, c + 32)], nbytes, 0.0) for c in range(32)])
    return [nbytes / t for t in times]


def test_oversubscription_two_to_one_halves_cross_leaf_bandwidth(specs: Any) -> None:
    full = cross_leaf_rates(specs, 64, 1.0)
    half = cross_leaf_rates(specs, 48, 2.0)
    assert full == pytest.approx([CHIP_EFA_BPS] * 32, rel=1e-9)
    assert half == pytest.approx([CHIP_EFA_BPS / 2] * 32, rel=1e-9)
    # Inside a leaf the chips keep their full bandwidth.
    topo = build(specs, 4, fabric="fat_tree", radix=48, oversubscription=2.0)
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    times = finish_times(env, [net.transfer([(c, c + 16)], 1e6, 0.0) for c in range(16)])
    assert times == pytest.approx([1e6 / CHIP_EFA_BPS] * 16, rel=1e-9)


def test_oversubscription_holds_for_any_port_split(specs: Any) -> None:
    """With radix 64 at 2:1 the leaf has 42 ports down and 22 up: the aggregate still halves."""
    rates = cross_leaf_rates(specs, 64, 2.0)
    assert sum(rates) == pytest.approx(32 * CHIP_EFA_BPS / 2, rel=1e-9)
    assert max(rates) <= CHIP_EFA_BPS * (1 + 1e-9)


def test_ecmp_spreads_flows_evenly(specs: Any) -> None:
    topo = build(specs, 8, fabric="fat_tree", radix=64)  # 4 leaves of 32 chips, 32 spines
    all_to_all = [(s, d) for s in range(32) for d in range(32, 64)]
    counts = spine_link_counts(topo, all_to_all)
    assert len(counts) == 32  # every uplink of leaf 0
    assert set(counts.values()) == {32}  # 1024 flows, 32 on each
    shift = [(s, s + 32) for s in range(32)]
    assert set(spine_link_counts(topo, shift).values()) == {1}
    # Random pairs: loads as even as hashing makes them (within about 4 standard deviations).
    rng = np.random.default_rng(3)
    chips = rng.integers(0, 128, (60_000, 2))
    chips = chips[chips[:, 0] // 32 != chips[:, 1] // 32]
    loads = np.asarray(list(spine_link_counts(topo, chips.tolist()).values()))
    assert loads.size == 4 * 32
    assert 0.75 * loads.mean() < loads.min() and loads.max() < 1.25 * loads.mean()


def test_three_tier_fat_tree(specs: Any) -> None:
    # Radix 8 and 4 NICs per instance: leaves of one instance (16 chips) with 4 uplinks,
    # pods of 4 leaves, 16 core switches.
    topo = build(specs, 8, fabric="fat_tree", radix=8, tiers=3, nics=4)
    fabric = topo.scaleout
    assert isinstance(fabric, TreeFabric)
    assert (fabric.span[1], fabric.width) == (4, (1, 4, 16))
    in_pod = nodes_of(topo, topo.route(0, 16))
    assert len(in_pod) == 5 and in_pod[2][:2] == ("spine", 2)
    across = nodes_of(topo, topo.route(0, 64))
    assert len(across) == 7 and across[3][:2] == ("spine", 3)
    pairs = [(s, d) for s in range(64) for d in range(64, 128)]  # pod 0 to pod 1
    flat, _ = topo.routes(pairs)
    cores = Counter(v for u, v in (topo.endpoints(int(x)) for x in flat) if v[:2] == ("spine", 3))
    assert len(cores) == 16 and set(cores.values()) == {256}


def test_rail_optimised(specs: Any) -> None:
    topo = build(specs, 4, fabric="rail", radix=64)  # one group: 16 rails of 4 chips
    fabric = topo.scaleout
    assert isinstance(fabric, TreeFabric)
    assert nodes_of(topo, topo.route(3, 19)) == [chip_node(3), ("rail", 3, 0), chip_node(19)]
    cross_rail = nodes_of(topo, topo.route(3, 20))
    assert cross_rail[1] == ("rail", 3, 0) and cross_rail[3] == ("rail", 4, 0)
    assert cross_rail[2][0] == "spine"
    # Instances of the next group hang off the same rails' next switches.
    big = build(specs, 40, fabric="rail", radix=64)
    assert nodes_of(big, big.route(3, 32 * 16 + 3))[1:4:2] == [("rail", 3, 0), ("rail", 3, 1)]


def test_failed_spine_link_takes_another_equal_cost_path(specs: Any) -> None:
    topo = build(specs, 8, fabric="fat_tree", radix=64)
    route = topo.route(5, 40)
    topo.set_link_state(route[1], "down")
    detour = topo.route(5, 40)
    assert len(detour) == len(route) == 4 and route[1] not in detour
    assert detour[0] == route[0] and detour[-1] == route[-1]
    flat, _ = topo.routes([(5, 40), (6, 41)])
    assert route[1] not in flat.tolist()
    # Displaced pairs spread over the surviving spines rather than piling on one.
    pairs = [(s, d) for s in range(32) for d in range(32, 128)]
    before = spine_link_counts(topo, pairs)
    assert route[1] not in before
    assert max(before.values()) <= 1.6 * np.mean(list(before.values()))
    topo.set_link_state(route[1], "up")
    assert topo.route(5, 40) == route


def test_host_link_down_detours_through_a_neighbour(specs: Any) -> None:
    topo = build(specs, 4, fabric="fat_tree", radix=64)
    route = topo.route(5, 40)
    topo.set_link_state(route[0], "down")
    detour = topo.route(5, 40)
    assert route[0] not in detour
    assert topo.kinds[detour[0]] == "neuronlink"


def test_leaf_cut_off_raises_partition_error_naming_the_cut(specs: Any) -> None:
    topo = build(specs, 4, fabric="fat_tree", radix=64)
    fabric = topo.scaleout
    assert isinstance(fabric, TreeFabric)
    for link in fabric.up[0][0].tolist():
        topo.set_link_state(link, "down")
    with pytest.raises(PartitionError) as info:
        topo.route(5, 40)
    message = str(info.value)
    assert "chip 5 cannot reach chip 40" in message
    assert "leaf0->spine2_" in message and "32 links down" in message
    assert len(topo.route(5, 20)) == 2  # inside the leaf all is well
    with pytest.raises(PartitionError):
        FlowNetwork(simpy.Environment(), topo).transfer([(0, 1), (5, 40)], 1.0, 0.0)


def test_fabric_too_small_for_the_cluster(specs: Any) -> None:
    with pytest.raises(ScenarioError) as info:
        build(specs, 40, fabric="fat_tree", radix=16, tiers=2)
    assert info.value.path == "cluster.efa.tiers"
    assert "raise efa.tiers or efa.radix" in str(info.value)
    assert build(specs, 40, fabric="fat_tree", radix=16, tiers=3).n_chips == 640


def test_scenario_selects_the_fabric() -> None:
    text = """
name: fabric-choice
cluster:
  instance: trn2.48xlarge
  count: 4
  efa: {fabric: fat_tree, tiers: 3, radix: 32, oversubscription: 2}
model: llama3-8b
parallelism: {tp: 8}
training: {seq_len: 2048, global_batch_size: 32}
"""
    res = load_scenario(text)
    assert (res.instance.efa.fabric, res.instance.efa.tiers) == ("fat_tree", 3)
    topo = build_topology(res.instance, res.chip, res.scenario.cluster.count)
    assert isinstance(topo.scaleout, TreeFabric) and topo.scaleout.name == "fat_tree"
    with pytest.raises(ScenarioError, match=r"cluster\.efa\.tiers"):
        load_scenario(text.replace("tiers: 3", "tiers: 0"))


def test_16k_chip_three_tier_fat_tree_builds_fast() -> None:
    inst = catalog.instance("trn2.48xlarge", {"efa": {"fabric": "fat_tree", "tiers": 3}})
    chip = catalog.chip("trn2")
    start = time.perf_counter()
    topo = build_topology(inst, chip, 1024)
    build_s = time.perf_counter() - start
    assert topo.n_chips == 16_384
    n = topo.n_chips
    start = time.perf_counter()
    flat, latency = topo.routes(np.stack([np.arange(n), (np.arange(n) + 16) % n], axis=1))
    route_s = time.perf_counter() - start
    assert latency.size == n and flat.size >= 2 * n
    print(f"16,384-chip 3-tier fat tree: build {build_s:.3f} s, 16,384 routes {route_s:.3f} s")
    assert build_s < 20.0  # measured about 0.1 s; generous for loaded CI machines


@pytest.mark.parametrize("fabric", ["fat_tree", "rail"])
def test_one_flow_across_leaves_spreads_over_the_chips_nic_ports(fabric: str) -> None:
    """A p5 GPU has 4 NIC ports: its flow to another leaf takes 4 equal-cost paths, so
    at oversubscription 1 it gets its whole share, as on the non-blocking fabric."""
    chip = catalog.chip("h100")
    over = {"efa": {"fabric": fabric, "radix": 16, "tiers": 3, "oversubscription": 1}}
    inst = catalog.instance("p5.48xlarge", over)
    topo = build_topology(inst, chip, 4)
    assert topo.scaleout is not None and topo.scaleout.spread == 4
    share = inst.efa.bandwidth_Bps / inst.chips * chip.efa_link_efficiency
    flat, weights, _ = topo.weighted_routes(np.asarray([0]), np.asarray([31]))
    assert weights is not None and weights.sum() == pytest.approx(flat.size / 4)
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    done = net.transfer([(0, 31)], 1e9, 0.0)
    env.run(until=done)
    assert env.now == pytest.approx(1e9 / share, rel=1e-9)


def test_oversubscription_at_the_top_tier() -> None:
    """Non-blocking pods, 2:1 into the top tier: the links into it carry half as much."""
    chip = catalog.chip("trn2")
    efa = {"fabric": "fat_tree", "tiers": 3, "radix": 8, "oversubscription": 2}
    top = build_topology(
        catalog.instance("trn2.48xlarge", {"efa": {**efa, "oversubscription_at": "top"}}),
        chip,
        8,
    )
    assert isinstance(top.scaleout, TreeFabric)
    assert leaf_ports(catalog.instance("trn2.48xlarge", {"efa": efa}).efa) == (5, 3)
    per_leaf, (down, up) = top.scaleout.per_leaf, (4, 4)
    host = float(top.capacity_Bps[top.scaleout.host_up[0]])
    first = float(top.capacity_Bps[top.scaleout.up[0][0, 0]])
    second = float(top.capacity_Bps[top.scaleout.up[1][0, 0]])
    assert per_leaf == down
    assert first == pytest.approx(per_leaf * host / up)  # non-blocking inside a pod
    assert second == pytest.approx(first / 2)  # oversubscribed into the top tier


@pytest.mark.parametrize(
    "efa",
    [
        {"fabric": "fat_tree", "radix": 8, "tiers": 3, "nics": 4},  # one path per pair
        {"fabric": "fat_tree", "radix": 64, "nics": 64},  # each chip over 4 NIC ports
        {"fabric": "rail", "radix": 64},
    ],
)
def test_pairs_standing_for_several_flows_load_links_as_every_copy(
    specs: Any, efa: dict[str, Any]
) -> None:
    """Pairs across domains and inside them, given once with how often each occurs, load
    every link as routing every copy does (ECMP hashes the pair; shares of whole flows
    over a power-of-two spread sum exactly)."""
    topo = build(specs, 8, **efa)
    rng = np.random.default_rng(3)
    src, dst = rng.integers(0, topo.n_chips, 400), rng.integers(0, topo.n_chips, 400)
    dst[:100] = src[:100] - src[:100] % 16 + rng.integers(0, 16, 100)  # some inside domains
    times = rng.integers(1, 5, 400)
    flat, weights, latency = topo.weighted_routes(src, dst, times)
    every = topo.weighted_routes(np.repeat(src, times), np.repeat(dst, times))
    links, counts = link_counts(flat, weights)
    want_links, want_counts = link_counts(every[0], every[1])
    assert links.tolist() == want_links.tolist() and counts.tolist() == want_counts.tolist()
    assert latency.max() == every[2].max()
