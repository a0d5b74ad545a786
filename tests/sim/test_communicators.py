"""One communicator's collectives run in turn (NCCL), different ones at once: closed forms.

Two p5 nodes, TP 8 inside each node (NVLink) and DP 2 across (each GPU's share of
EFA): the TP and DP groups cross disjoint links. With the runtime's fixed costs
off, a collective costs its alpha-beta time alone, so two on one communicator end
at the sum of their times and two on different communicators at the larger.
"""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from clustersim.hardware.chip import ChipModel
from clustersim.network import Network
from clustersim.network.fabric import build_topology
from clustersim.scenario import Resolved, load_scenario
from clustersim.sim.engine import StepSim, compile_program
from clustersim.workload import make_layout
from clustersim.workload.layout import Layout
from clustersim.workload.program import Instr, Kind, Phase, Program

TWO_NODES = """\
name: two-nodes
cluster: {instance: p5.48xlarge, count: 2}
model: {name: m, layers: 2, hidden: 1024, heads: 8, kv_heads: 8, ffn_hidden: 4096, vocab: 128}
parallelism: {tp: 8, pp: 1, dp: 2, zero: 0}
training: {seq_len: 1024, global_batch_size: 2, steps: 1}
"""
MB = 2.0**20


def _setup() -> tuple[Resolved, Layout]:
    res = load_scenario(TWO_NODES)
    sc = res.scenario
    return res, make_layout(sc.parallelism, res.ranks, res.ranks_per_chip, res.ranks_per_node)


def _async(group: str, nbytes: float) -> Instr:
    return Instr(
        Kind.ASYNC_COLLECTIVE, f"{group}.all_gather", Phase.GRAD_SYNC,
        collective="all_gather", group=group, nbytes=nbytes,
    )  # fmt: skip


def _ends(instrs: list[Instr], *, serial: bool, folded: bool = False) -> list[float]:
    """Rank 0's end time of each instruction, the program run on every rank."""
    res, layout = _setup()
    env = simpy.Environment()
    network = Network(env, build_topology(res.instance, res.chip, 2), np.arange(res.ranks))
    program = [*instrs, Instr(Kind.WAIT_ASYNC, "wait", Phase.GRAD_SYNC)]
    compiled = compile_program(Program(0, program), ChipModel(res.chip, res.lnc))
    sim = StepSim(env, network, layout, [compiled], 1, folded=folded, serial_communicators=serial)
    sim.run()
    _, ends = compiled.op_times(sim.seg_start[0], sim.seg_end[0])
    return [float(t) for t in ends]


def _alone(group: str, nbytes: float) -> float:
    """The seconds of one collective of ``group``, every group of that name at once."""
    res, layout = _setup()
    env = simpy.Environment()
    network = Network(env, build_topology(res.instance, res.chip, 2), np.arange(res.ranks))
    for ranks in {layout.group(group, r) for r in range(res.ranks)}:
        network.collective("all_gather", ranks, nbytes)
    env.run()
    return float(env.now)


@pytest.mark.parametrize("folded", [False, True])
def test_two_collectives_of_one_communicator_take_the_sum(folded: bool) -> None:
    big, small = 64 * MB, 16 * MB
    t_big, t_small = _alone("dp", big), _alone("dp", small)
    ends = _ends([_async("dp", big), _async("dp", small)], serial=True, folded=folded)
    assert ends[0] == pytest.approx(t_big, rel=1e-6)
    assert ends[1] == pytest.approx(t_big + t_small, rel=1e-6)
    # Without the ordering the small one shares the links with the big one and ends
    # first, at about twice its time alone (its latency paid once).
    shared = _ends([_async("dp", big), _async("dp", small)], serial=False, folded=folded)
    assert 1.5 * t_small < shared[1] < t_big


def test_two_communicators_over_disjoint_links_take_the_max() -> None:
    dp, tp = 64 * MB, 256 * MB
    t_dp, t_tp = _alone("dp", dp), _alone("tp", tp)
    ends = _ends([_async("dp", dp), _async("tp", tp)], serial=True)
    assert ends[0] == pytest.approx(t_dp, rel=1e-6)
    assert ends[1] == pytest.approx(t_tp, rel=1e-6)
    assert ends[-1] == pytest.approx(max(t_dp, t_tp), rel=1e-6)
    assert 0.2 < t_dp / t_tp < 5  # comparable, so a sum would show


def test_a_blocking_collective_waits_for_the_asynchronous_ones_before_it() -> None:
    """The blocking all-gather of one communicator queues behind its bucket in flight."""
    nbytes = 32 * MB
    t = _alone("dp", nbytes)
    blocking = Instr(
        Kind.COLLECTIVE, "dp.all_gather", Phase.PARAM_SYNC,
        collective="all_gather", group="dp", nbytes=nbytes,
    )  # fmt: skip
    ends = _ends([_async("dp", nbytes), blocking], serial=True)
    assert ends[1] == pytest.approx(2 * t, rel=1e-6)
