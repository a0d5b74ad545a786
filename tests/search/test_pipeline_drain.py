"""The estimate's 1F1B stepping, the drain's delays, ZeRO-3's SM losses and the torus
all-to-all, against closed forms and the simulated network."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from clustersim.hardware.chip import ChipModel
from clustersim.network import Network
from clustersim.network.fabric import build_topology
from clustersim.network.runtimes import runtime_of
from clustersim.scenario import load_scenario
from clustersim.search import Estimator, NetModel
from clustersim.search.drain import _lost_s
from clustersim.search.experts import ring_load
from clustersim.search.pipeline import last_backward_ends
from clustersim.search.sharded import FsdpUse, fsdp_overhead


def test_equal_stages_without_hops_follow_the_closed_form() -> None:
    """sum_s (F + B) + (m - 1) max (F + B) for stage 0; stage s ends s B earlier."""
    pp, m, f, b = 4, 6, 1.0, 2.0
    ends = last_backward_ends([f] * pp, [b] * pp, 0.0, m)
    assert ends[0] == pytest.approx(pp * (f + b) + (m - 1) * (f + b))
    assert ends == pytest.approx([ends[0] - s * b for s in range(pp)])


def test_steady_state_takes_two_hops_per_microbatch() -> None:
    """A stage's backward waits for the next stage's forward and backward of a
    microbatch it sent a cycle before: F + B + 2 hops per microbatch."""
    f, b, hop, pp = 1.0, 2.0, 0.1, 4
    ends = [last_backward_ends([f] * pp, [b] * pp, hop, m)[0] for m in (8, 9)]
    assert ends[1] - ends[0] == pytest.approx(f + b + 2 * hop)


def test_uneven_stages_and_few_microbatches() -> None:
    """m < pp: every forward first, then the backwards; the fill and the drain
    through the stages, each hop once each way."""
    fwd, bwd, hop = [1.0, 3.0, 2.0], [2.0, 5.0, 4.0], 0.5
    ends = last_backward_ends(fwd, bwd, hop, 1)
    fill = sum(fwd) + 2 * hop
    assert ends[2] == pytest.approx(fill + bwd[2])
    assert ends[1] == pytest.approx(fill + bwd[2] + hop + bwd[1])
    assert ends[0] == pytest.approx(fill + sum(bwd) + 2 * hop)


def test_a_late_last_backward_delays_every_stage_before_it() -> None:
    fwd, bwd = [1.0] * 4, [2.0] * 4
    base = last_backward_ends(fwd, bwd, 0.1, 8)
    late = last_backward_ends(fwd, bwd, 0.1, 8, [0.0, 0.0, 0.3, 0.0])
    assert [b - a for a, b in zip(base, late, strict=True)] == pytest.approx([0.3, 0.3, 0.3, 0.0])


def test_buckets_slow_a_collective_while_they_hold_the_links() -> None:
    """Two buckets of 1 s on the links start with a collective of 0.5 s there, each
    putting as many flows on a link as it does: 2 x 0.5 s lost; a later collective
    finds 1 s of their bytes left (2 s, less 0.5 s of time and the 1 s served
    while the first waited), and loses no more than that."""
    lost = _lost_s([(0.0, 1.0), (0.0, 1.0)], [(0.0, 0.5), (0.5, 2.0)], 1.0)
    assert lost == pytest.approx(1.0 + 0.5)


def test_buckets_in_turn_slow_a_collective_one_at_a_time() -> None:
    """NCCL runs one communicator's collectives in turn: of two buckets queued, one
    is on the links when the collective starts."""
    lost = _lost_s([(0.0, 1.0), (0.0, 1.0)], [(0.0, 0.5)], 1.0, serial=True)
    assert lost == pytest.approx(0.5)


def test_zero3_compute_slowed_by_the_sms_hides_more_of_the_gather() -> None:
    """A unit of 1 s whose gather of 3 s is in flight all along: at 1 - f of its
    speed it takes 1/(1 - f) s, and waits only what the gather outlasts that."""
    f = 0.2
    uses = [FsdpUse(1.0, 3.0, 0.0, backward=False) for _ in range(4)]
    plain, slowed = fsdp_overhead(uses, 1), fsdp_overhead(uses, 1, f)
    assert plain.fwd_s == pytest.approx(4 * (3.0 - 1.0))
    assert slowed.fwd_lost_s == pytest.approx(4 * f / (1 - f))
    assert slowed.fwd_s + slowed.fwd_lost_s == pytest.approx(plain.fwd_s)


@pytest.mark.parametrize(
    ("d", "load"), [(2, 1.0), (3, 1.0), (4, 2.0), (5, 3.0), (6, 5.0), (8, 8.0)]
)
def test_ring_load(d: int, load: float) -> None:
    assert ring_load(d) == load


def test_ring_load_of_members_two_links_apart() -> None:
    # {0, 2} and {1, 3} on a 4-ring: each pair's chips share a parity, so one group's
    # peers half way round go the positive way and the other's the negative way
    assert ring_load(2, 2) == 1.0
    assert ring_load(4, 2) == 1 * 2 + 2  # offsets 1 and 3 two links each, ties ceil(8/4)


TRN2U = """\
name: a2a
cluster: {instance: trn2u.48xlarge, count: 4}
model: llama3-8b
parallelism: {tp: 1, pp: 1}
training: {seq_len: 4096, global_batch_size: 64}
"""


@pytest.mark.parametrize(("size", "stride"), [(16, 1), (64, 1), (16, 4), (256, 1)])
def test_torus_all_to_all_as_simulated(size: int, stride: int) -> None:
    """An all-to-all over a Trn2 instance's x axis (16 ranks), its 4x4 torus (64),
    every chip's rank 0 (16, stride 4) and the UltraServer (256): each group of that
    shape at once, as a stage runs it."""
    res = load_scenario(TRN2U)
    rpc, ranks = res.ranks_per_chip, res.ranks
    net = NetModel.of(res.instance, res.chip, 4, res.lnc)
    est = Estimator(res.model, res.scenario.training, ChipModel(res.chip, res.lnc), net)
    env = simpy.Environment()
    topo = build_topology(res.instance, res.chip, 4, path="cluster")
    runtime = runtime_of(res.chip, res.instance, in_program=True)  # as a training step runs
    network = Network(env, topo, np.arange(ranks) // rpc, runtime=runtime)
    groups = [
        tuple(base + off + k * stride for k in range(size))
        for base in range(0, ranks, size * stride)
        for off in range(stride)
    ]
    nbytes, ends = 29_360_128.0, []
    ev = network.collective("all_to_all", groups[0], nbytes, replicas=np.array(groups))
    ev.callbacks.append(lambda _: ends.append(env.now))
    env.run()
    assert est.coll_s(stride, size, "all_to_all", nbytes) == pytest.approx(ends[0], rel=0.01)
