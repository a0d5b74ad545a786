"""The estimate of a full recompute run beside the next layer's backward (``search.beside``).

Under the ``dataflow`` TP rule the simulator interleaves each layer's backward with
the recompute of the layer before it (``workload.overlap.interleave_recompute``); the
estimate times the same interleaved list on one rank.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from clustersim.hardware.chip import ChipModel
from clustersim.hardware.work import Work
from clustersim.scenario import load_scenario
from clustersim.search.beside import pair_beside
from clustersim.search.estimate import Estimator, estimate_resolved
from clustersim.search.netmodel import Level, NetModel, collective_wire_s
from clustersim.sim import simulate
from clustersim.workload import make_layout
from clustersim.workload.ops import Tpl
from clustersim.workload.program import Kind
from clustersim.workload.templates import coll

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def _op(secs: float) -> Tpl:
    return (Kind.COMPUTE, "op", "bwd", Work(vector_ops=secs), "", "", 0.0)


class _Links:
    """Every TP collective takes 2 s, all of it on the links."""

    def coll_s(self, stride: int, size: int, op: str, nbytes: float) -> float:
        return 2.0

    def wire_s(self, stride: int, size: int, op: str, nbytes: float) -> float:
        return 2.0

    def contended_s(self, stride: int, size: int, op: str, nbytes: float) -> float:
        return 2.0


def _pair(bwd: tuple[Tpl, ...], rec: tuple[Tpl, ...]) -> Any:
    layout: Any = SimpleNamespace(tp=2, cp=1, ep=1, etp=1, edp=1)
    return pair_beside(bwd, rec, layout, lambda w: w.vector_ops, _Links())


def test_each_collective_hides_under_the_other_lists_compute() -> None:
    """Backward: 1 s, a 2 s collective, 3 s. Recompute: 4 s, a 2 s collective, 1 s.
    One after the other: 13 s. Beside: the backward's collective (1-3 s) runs under
    the recompute's 4 s, the recompute's (5-7 s) under the backward's 3 s: 9 s."""
    tp = coll("tp", "all_gather", "bwd", 1.0)
    pair = _pair((_op(1), tp, _op(3)), (_op(4), tp, _op(1)))
    assert pair.saved_s == pytest.approx(4.0)
    # neither is waited for, so the buckets on the links would cost the rank nothing
    assert [w for _, w in pair.comms] == [0.0, 0.0]


def test_collectives_in_flight_at_once_share_the_links() -> None:
    """Backward: 1 s, a 2 s collective, 1 s. Recompute: the collective at once, 1 s.
    Both collectives start at 1 s and share the links: both end at 5 s, and the pair
    takes 5 + 1 + 1 = 7 s, what the two take one after the other: nothing saved."""
    tp = coll("tp", "all_gather", "bwd", 1.0)
    pair = _pair((_op(1), tp, _op(1)), (tp, _op(1)))
    assert pair.saved_s == pytest.approx(0.0)


def test_a_second_collective_adds_its_link_seconds_unless_dma_bound() -> None:
    """Two at once on a ring: twice the bytes on each link. A halving-doubling
    message bound by its DMA queues (here 1 GB/s against a 100 GB/s link) leaves the
    link room for the other's: nothing added."""
    ring = [Level(size=4, bw_Bps=1e9, latency_s=0.0)]
    alone = collective_wire_s("all_gather", 1e9, ring, 1)
    assert alone == pytest.approx(0.75)
    assert collective_wire_s("all_gather", 1e9, ring, 1, together=2) == pytest.approx(alone)
    res = load_scenario(SCENARIOS / "trn1-llama2-7b.yaml")
    net = NetModel.of(res.instance, res.chip, 16, res.lnc)
    levels, sharing = net.levels(1, 8)
    one = collective_wire_s("all_gather", 2**25, levels, sharing, net.runtime)
    more = collective_wire_s("all_gather", 2**25, levels, sharing, net.runtime, together=2)
    assert 0 < more < one  # Trn1's on-chip halving step is DMA-bound


def _blocks(sets: list[str]) -> Any:
    res = load_scenario(SCENARIOS / "trn2-llama3-8b.yaml", sets)
    sc = res.scenario
    layout = make_layout(sc.parallelism, res.ranks, res.ranks_per_chip)
    chip = ChipModel(res.chip, res.lnc)
    net = NetModel.of(res.instance, res.chip, sc.cluster.count, res.lnc)
    return Estimator(res.model, sc.training, chip, net).blocks(sc.parallelism, layout)


def test_only_where_the_simulator_runs_it_beside() -> None:
    full = ["parallelism.recompute=full"]
    assert _blocks(full).beside[("dense", "dense")].saved_s > 0
    assert not _blocks([*full, "parallelism.zero=3"]).beside  # gathered per layer
    assert not _blocks([*full, "parallelism.tp_comm_overlap=backward"]).beside
    assert not _blocks(["parallelism.recompute=selective"]).beside


# Measured est/sim step-time ratios, before the estimate ran the recompute beside and
# after: Trn2 Llama-3-8B (TP 8, 16 sequences) 1.050 -> 1.003; Trn1 Llama-2-7B (TP 8 x
# DP 64) 1.121 -> 0.998; the same rows under the backward rule (no recompute beside)
# 0.998 and 0.997. Each simulates a step (seconds): slow.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("scenario", "sets"),
    [
        ("trn2-llama3-8b.yaml", ["training.global_batch_size=16"]),
        ("trn1-llama2-7b.yaml", []),
    ],
    ids=["trn2", "trn1"],
)
def test_full_recompute_estimate_within_1_percent(scenario: str, sets: list[str]) -> None:
    sets = [*sets, "parallelism.recompute=full", "failures={}", "training.steps=1"]
    res = load_scenario(SCENARIOS / scenario, sets)
    assert res.scenario.parallelism.tp_comm_overlap == "dataflow"
    est = estimate_resolved(res)
    sim = simulate(res, record=False).summary
    assert est.compute_s == pytest.approx(sim["breakdown_s"]["compute"], rel=1e-6)
    assert est.step_time_s == pytest.approx(sim["step_time_s"], rel=0.01)
