"""In-network all-reduce (InfiniBand SHARP: ``sharp``, ``nvls_sharp``) on the DGX nodes'
rail-optimised fabric: steps, alpha-beta closed forms, NCCL's choice, and refusals."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import simpy

from clustersim import catalog
from clustersim.errors import ScenarioError
from clustersim.network import GroupInfo, Network, Step, collective_steps
from clustersim.network.fabric import Topology, build_topology, chip_node
from clustersim.network.microbench import run_collective
from clustersim.network.runtimes import NeuronRuntime, Protocol, runtime_of

GIB = 2.0**30
NODES = 4


@dataclass(frozen=True)
class Fixed:
    """A runtime that runs what it is asked with no fixed costs (the closed forms')."""

    name: str = "fixed"

    def choose(
        self, op: str, p: int, nbytes: float, info: GroupInfo, algorithm: str
    ) -> tuple[str, Protocol]:
        del op, p, nbytes, info
        return algorithm, Protocol()


def _dgx(count: int = NODES) -> tuple[Topology, float, float, float]:
    """``count`` DGX H100 nodes, one rank's bandwidth over NVLink and over its NIC,
    and the route latency between two nodes' GPUs of one rail."""
    chip, inst = catalog.chip("h100"), catalog.instance("dgx-h100")
    topo = build_topology(inst, chip, count)
    nvlink = inst.fabric.link_bw_Bps * chip.calibration.link_efficiency
    nic = inst.efa.bandwidth_Bps / inst.chips * chip.efa_link_efficiency
    return topo, nvlink, nic, inst.efa.latency_s


def _time(topo: Topology, algorithm: str, ranks: list[int], nbytes: float) -> float:
    env = simpy.Environment()
    net = Network(env, topo, range(topo.n_chips), {"all_reduce": algorithm}, runtime=Fixed())
    env.run(until=net.collective("all_reduce", ranks, nbytes))
    return float(env.now)


def test_steps_load_each_nic_with_the_buffer_once_each_way() -> None:
    one_per_node = GroupInfo.of(range(3), range(3))
    (step,) = collective_steps("all_reduce", 3, 6.0, "sharp", one_per_node)
    assert step == Step(((0, 1), (1, 2), (2, 0)), 6.0, pipelined=True, reduces=True, hops=(0, 1))
    two_by_two = GroupInfo.of(range(4), [0, 0, 1, 1])
    (step,) = collective_steps("all_reduce", 4, 8.0, "nvls_sharp", two_by_two)
    inside = ((0, 1), (1, 0), (2, 3), (3, 2))
    assert step.pairs == inside * 2 + ((0, 2), (2, 0), (1, 3), (3, 1))
    assert (step.bytes_per_flow, step.hops) == (4.0, (1, 1))
    # one node: no switch between nodes to reduce in, the ring runs
    assert collective_steps("all_reduce", 4, 8.0, "sharp", GroupInfo.flat(4))[0].repeats == 6


@pytest.mark.parametrize("nbytes", [2.0**20, GIB])
def test_one_rank_per_node_closed_form_against_the_ring(nbytes: float) -> None:
    """A data-parallel group of one GPU per node (rail 0): alpha + n / B against the
    ring's 2 (p - 1) alpha + 2 (p - 1) / p n / B."""
    topo, _, nic, alpha = _dgx()
    ranks = [8 * d for d in range(NODES)]
    sharp = _time(topo, "sharp", ranks, nbytes)
    assert sharp == pytest.approx(alpha + nbytes / nic, rel=1e-9)
    ring = _time(topo, "ring", ranks, nbytes)
    p = NODES
    assert ring == pytest.approx(2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes / nic, rel=1e-9)


def test_whole_nodes_closed_forms() -> None:
    """Eight GPUs per node: each NIC carries n / 8 each way; inside the node NVLS's
    switch carries n per GPU, the direct phases 2 (L - 1) / L n."""
    topo, nvlink, nic, alpha = _dgx()
    ranks = list(range(8 * NODES))
    L = 8
    sharp = _time(topo, "sharp", ranks, GIB)
    # both NVLink hops inside and the one across pay the longest route (no protocol)
    assert sharp == pytest.approx(3 * alpha + GIB * max(2 * (L - 1) / (L * nvlink), 1 / (L * nic)))
    nvls = _time(topo, "nvls_sharp", ranks, GIB)
    assert nvls == pytest.approx(2 * alpha + GIB * max(1 / nvlink, 1 / (L * nic)))


def test_the_rail_keeps_one_rank_per_node_on_its_leaf() -> None:
    """GPU k of every node hangs off rail switch k: a data-parallel group of tensor-parallel
    ranks reduces without the spine."""
    chip, inst = catalog.chip("h100"), catalog.instance("dgx-h100")
    topo = build_topology(inst, chip, NODES)
    g = topo.graph
    for k in (0, 5):
        leaves = {n for d in range(NODES) for n in g.successors(chip_node(8 * d + k))}
        leaves = {n for n in leaves if n[0] == "rail"}
        assert leaves == {("rail", k, 0)}


def test_nccl_runs_sharp_where_the_switches_reduce() -> None:
    rows = run_collective("dgx-h100", NODES, "all_reduce", [GIB])
    assert rows[0]["algorithm"] == "nvls_sharp"
    off = run_collective("dgx-h100", NODES, "all_reduce", [GIB], efa={"sharp": False})
    assert off[0]["algorithm"] not in ("sharp", "nvls_sharp")
    # in the switches the NICs carry half a tree's bytes: faster at 1 GiB
    assert rows[0]["time_s"] < off[0]["time_s"]


def test_tuning_model_prices_in_network_all_reduce_by_its_flows() -> None:
    chip, inst = catalog.chip("h100"), catalog.instance("dgx-h100")
    rt = runtime_of(chip, inst)
    info = GroupInfo.of(range(8 * NODES), [i // 8 for i in range(8 * NODES)])
    zero = rt.predict_s("all_reduce", 8 * NODES, 0.0, info, ("nvls_sharp", "Simple"))
    big = rt.predict_s("all_reduce", 8 * NODES, GIB, info, ("nvls_sharp", "Simple"))
    bus = min(rt.intra_Bps * rt.nvls_efficiency, rt.inter_Bps * 8)
    assert big - zero == pytest.approx(GIB / (bus * 5 / 6), rel=1e-3)
    one_per_node = GroupInfo.of(range(NODES), range(NODES))
    zero = rt.predict_s("all_reduce", NODES, 0.0, one_per_node, ("sharp", "Simple"))
    big = rt.predict_s("all_reduce", NODES, GIB, one_per_node, ("sharp", "Simple"))
    assert big - zero == pytest.approx(GIB / rt.inter_Bps)
    assert rt.choose("all_reduce", NODES, GIB, one_per_node, "auto")[0] == "sharp"
    # nvls_sharp over one GPU per node is sharp; over one node, NVLS
    assert rt.choose("all_reduce", NODES, GIB, one_per_node, "nvls_sharp")[0] == "sharp"
    assert rt.choose("all_reduce", 8, GIB, GroupInfo.flat(8), "nvls_sharp")[0] == "nvls"


@pytest.mark.parametrize("instance", ["p5.48xlarge", "p5-roce", "dgx-a100"])
@pytest.mark.parametrize("algorithm", ["sharp", "nvls_sharp"])
def test_sharp_on_a_fabric_without_it_is_refused(instance: str, algorithm: str) -> None:
    with pytest.raises(ScenarioError) as err:
        run_collective(instance, 2, "all_reduce", [GIB], algorithm=algorithm)
    assert err.value.path == "cluster.collectives.all_reduce"
    assert err.value.value == algorithm
    with pytest.raises(ScenarioError, match="InfiniBand"):
        NeuronRuntime().choose("all_reduce", 4, 1.0, GroupInfo.flat(4), algorithm)


def test_the_catalog_declares_sharp_on_infiniband_only() -> None:
    for name in catalog.names("instances"):
        efa = catalog.instance(name).efa
        assert not efa.sharp or efa.network == "infiniband", name
    with pytest.raises(ScenarioError) as err:
        catalog.instance("p5.48xlarge", {"efa": {"sharp": True}}, "cluster")
    assert err.value.path == "cluster.efa.sharp" and "InfiniBand" in str(err.value)
