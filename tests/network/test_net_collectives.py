"""Collective algorithms and the Network against the alpha-beta closed forms."""

from __future__ import annotations

from typing import Any

import pytest
import simpy

import clustersim.network as network_pkg
from clustersim import catalog
from clustersim.errors import PartitionError, ScenarioError
from clustersim.network import Network, Step, algorithm_names, collective_steps
from clustersim.network.topology import Topology, build_topology, chip_node


def run(net: Network, op: str, ranks: Any, nbytes: float) -> float:
    env = net.env
    start = env.now
    done = net.collective(op, list(ranks), nbytes)
    env.run(until=done)
    return float(env.now - start)


def ring_topology(p: int, cap: float = 1e9, lat: float = 2e-6) -> Topology:
    topo = Topology("ring", chips_per_instance=p, local_bw_Bps=1e12)
    for i in range(p):
        topo.add_link(
            chip_node(i), chip_node((i + 1) % p), capacity_Bps=cap, latency_s=lat, kind="neuronlink"
        )
    return topo


# -- steps --------------------------------------------------------------------------------------


def test_ring_steps() -> None:
    (step,) = collective_steps("all_reduce", 4, 8.0, "ring")
    assert step == Step(((0, 1), (1, 2), (2, 3), (3, 0)), 2.0, 6)
    (step,) = collective_steps("all_gather", 4, 8.0)
    assert step.repeats == 3
    assert step.bytes_per_flow == 2.0
    assert collective_steps("all_reduce", 1, 8.0) == []


def test_pairwise_rounds_are_distinct_steps() -> None:
    steps = collective_steps("all_to_all", 4, 8.0)
    assert len(steps) == 3
    assert steps[1].pairs == ((0, 2), (1, 3), (2, 0), (3, 1))
    assert all(s.bytes_per_flow == 2.0 and s.repeats == 1 for s in steps)


def test_unknown_algorithm_lists_valid_names() -> None:
    with pytest.raises(ScenarioError) as info:
        collective_steps("all_reduce", 4, 8.0, "butterfly")
    assert "cluster.collectives.all_reduce" in str(info.value)
    assert "auto, ring" in str(info.value)
    with pytest.raises(ScenarioError, match="does not implement all_reduce"):
        collective_steps("all_reduce", 4, 8.0, "pairwise")
    with pytest.raises(ScenarioError, match="unknown collective"):
        collective_steps("gossip", 4, 8.0)
    assert algorithm_names("all_to_all") == ["auto", "pairwise"]


def test_network_validates_algorithms(specs: Any) -> None:
    topo = build_topology(specs.instance(), specs.chip(), 1)
    with pytest.raises(ScenarioError) as info:
        Network(simpy.Environment(), topo, range(16), {"all_gather": "tree"})
    assert str(info.value).startswith("cluster.collectives.all_gather: unknown algorithm")
    assert "valid: auto, ring" in str(info.value)
    net = Network(simpy.Environment(), topo, range(16), {"all_gather": "ring"})
    assert net.algorithms["all_gather"] == "ring"


# -- oracles ------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [2, 4, 8, 16])
@pytest.mark.parametrize("nbytes", [1e4, 1e6, 64e6])
def test_ring_all_reduce_on_the_torus_snake(specs: Any, p: int, nbytes: float) -> None:
    topo = build_topology(specs.instance(), specs.chip(link_efficiency=0.8), 1)
    net = Network(simpy.Environment(), topo, range(16))
    a, b = specs.link_latency_s, 1 / (0.8 * specs.link_Bps)
    expected = 2 * (p - 1) * a + 2 * (p - 1) / p * nbytes * b
    assert run(net, "all_reduce", range(p), nbytes) == pytest.approx(expected, rel=0.01)
    expected = (p - 1) * a + (p - 1) / p * nbytes * b
    for op in ("reduce_scatter", "all_gather"):
        assert run(net, op, range(p), nbytes) == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_ring_collectives_on_a_custom_ring(p: int) -> None:
    cap, lat, n = 1e9, 2e-6, 3e6
    net = Network(simpy.Environment(), ring_topology(p, cap, lat), range(p))
    assert run(net, "all_reduce", range(p), n) == pytest.approx(
        2 * (p - 1) * lat + 2 * (p - 1) / p * n / cap, rel=0.01
    )
    assert run(net, "reduce_scatter", range(p), n) == pytest.approx(
        (p - 1) * lat + (p - 1) / p * n / cap, rel=0.01
    )
    assert run(net, "broadcast", range(p), n) == pytest.approx((p - 1) * lat + n / cap, rel=0.01)
    assert run(net, "reduce", range(p)[::-1], n) == pytest.approx((p - 1) * lat + n / cap, rel=0.01)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_pairwise_all_to_all_through_a_switch(specs: Any, p: int) -> None:
    topo = build_topology(specs.instance("switch", dims=(), chips=8), specs.chip(), 1)
    net = Network(simpy.Environment(), topo, range(8))
    n = 8e6
    expected = (p - 1) * specs.link_latency_s + (p - 1) / p * n / specs.link_Bps
    assert run(net, "all_to_all", range(p), n) == pytest.approx(expected, rel=0.01)


def test_ring_across_instances_is_bound_by_efa(specs: Any) -> None:
    topo = build_topology(specs.instance(), specs.chip(), 2)
    net = Network(simpy.Environment(), topo, range(32))
    p, n = 32, 64e6
    efa_Bps = specs.efa_Bps / 16
    expected = 2 * (p - 1) * (specs.efa_latency_s + n / p / efa_Bps)
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
    net = Network(env, topo, [r // 4 for r in range(64)])
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


def test_partitioned_group_raises_at_the_call(specs: Any) -> None:
    topo = Topology("pair", chips_per_instance=3, local_bw_Bps=1e9)
    topo.add_duplex(chip_node(0), chip_node(1), capacity_Bps=1e9, latency_s=0.0, kind="neuronlink")
    net = Network(simpy.Environment(), topo, [0, 1, 2])
    with pytest.raises(PartitionError, match="chip 1 cannot reach chip 2"):
        net.collective("all_gather", [0, 1, 2], 3.0)
    with pytest.raises(PartitionError):
        net.send(2, 0, 1.0)


def test_catalog_trn2_all_reduce_runs() -> None:
    inst, chip = catalog.instance("trn2.48xlarge"), catalog.chip("trn2")
    topo = build_topology(inst, chip, 1)
    net = Network(simpy.Environment(), topo, [r // 4 for r in range(64)])
    t = run(net, "all_reduce", range(0, 64, 4), 256e6)
    busbw = 256e6 / t * 2 * 15 / 16
    assert 0.5 * inst.fabric.link_bw_Bps < busbw < inst.fabric.link_bw_Bps


def test_public_api() -> None:
    for name in network_pkg.__all__:
        assert hasattr(network_pkg, name), name
    assert {"Network", "Topology", "FlowNetwork", "build_topology"} <= set(network_pkg.__all__)
