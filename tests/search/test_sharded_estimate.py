"""The search's estimate of sharded layouts (ZeRO-2/3, HSDP) against the simulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.hardware.chip import ChipModel
from clustersim.scenario import load_scenario
from clustersim.search import Estimator, NetModel, layouts_of
from clustersim.search.estimate import estimate_resolved
from clustersim.search.sharded import FsdpUse, fsdp_overhead
from clustersim.sim import simulate
from clustersim.workload import make_layout

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"

# The estimate of a sharded layout holds to 3% of the detailed simulation's step for
# each case: it models that the layers' TP collectives share links with ZeRO-2's buckets
# and ZeRO-3's gathers, that the gathers and reduce-scatters in flight share the shard
# group's links, and that on GPUs a unit's compute runs slower while they are in flight.
# Trn2 ZeRO-3 by layer is held to 4%: there the simulated gathers hide more than the
# estimate's gather stream credits them, a gap not yet explained.
TOLERANCE = {"trn2-llama3-8b.yaml ['parallelism.zero=3']": 0.04}
CASES = [
    ("p5-llama3-8b.yaml", ["parallelism.zero=3"]),
    ("p5-llama3-8b.yaml", ["parallelism.zero=2"]),
    ("p5-llama3-8b.yaml", ["parallelism.zero=2", "parallelism.dp_shard=2"]),
    (
        "p5-llama3-8b.yaml",
        ["parallelism.zero=3", "parallelism.tp=1", "parallelism.fsdp.prefetch=0"],
    ),
    ("trn2-llama3-8b.yaml", ["parallelism.zero=3"]),
    ("trn2-llama3-8b.yaml", ["parallelism.zero=2"]),
    ("trn2-llama3-8b.yaml", ["parallelism.zero=3", "parallelism.fsdp.unit=stage"]),
    (
        "trn2-llama3-8b.yaml",
        ["parallelism.zero=3", "parallelism.pp=2", "parallelism.fsdp.reshard_after_forward=false"],
    ),
]


@pytest.mark.parametrize(("scenario", "sets"), CASES, ids=str)
def test_sharded_estimate_within_3_percent(scenario: str, sets: list[str]) -> None:
    res = load_scenario(SCENARIOS / scenario, [*sets, "training.global_batch_size=16"])
    sc = res.scenario
    layout = make_layout(sc.parallelism, res.ranks, res.ranks_per_chip)
    chip = ChipModel(res.chip, res.lnc)
    net = NetModel.of(res.instance, res.chip, sc.cluster.count, res.lnc)
    est = Estimator(res.model, sc.training, chip, net)(sc.parallelism, layout)
    sim = simulate(res, record=False, fidelity="detailed").summary
    rel = TOLERANCE.get(f"{scenario} {sets}", 0.03)
    assert est.step_time_s == pytest.approx(sim["step_time_s"], rel=rel)
    assert est.compute_s == pytest.approx(sim["breakdown_s"]["compute"], rel=1e-6)


def test_fsdp_over_the_ultraserver_torus_with_tp_16() -> None:
    """Llama-3-70B, TP 16 x FSDP 16 on a Trn2 UltraServer (the search table's fifth
    row). Each shard group (chips 0, 4, 8, 12 of an instance's snake, and the same
    chips of the other instances) is no grid: its flat ring hops along x as well as
    y and z, over the TP groups' x links, so the layers' TP collectives share them
    with its gathers. The estimate must see those tiers (taking the group for a y line
    leaves out the shared x links and underestimates the step) and come within 3% of
    the folded simulation."""
    from clustersim.search.sharded import flat_ring_tiers

    sets = ["parallelism.tp=16", "parallelism.pp=1", "parallelism.zero=3"]
    sets.append("parallelism.recompute=none")
    res = load_scenario(SCENARIOS / "trn2-ultraserver-llama3-70b.yaml", sets)
    net = NetModel.of(res.instance, res.chip, res.scenario.cluster.count, res.lnc)
    assert flat_ring_tiers(net.torus, 16, 16) == {"x", "y", "domain"}
    assert flat_ring_tiers(net.torus, 1, 16) == set()  # TP: a grid (the chips, then x)
    est = estimate_resolved(res)
    sim = simulate(res, record=False, fidelity="folded").summary
    assert est.step_time_s == pytest.approx(sim["step_time_s"], rel=0.03)


def test_gather_stream_closed_form() -> None:
    """Units of 1 s compute whose gathers take 3 s: with prefetch 1 each waits 2 s."""
    uses = [FsdpUse(1.0, 3.0, 0.0, backward=False) for _ in range(4)]
    sh = fsdp_overhead(uses, prefetch=1)
    # Per pass in steady state: every gather runs back to back, 4 x 3 s for 4 s of compute.
    assert sh.fwd_s == pytest.approx(4 * 3.0 - 4 * 1.0)
    assert sh.once_s == pytest.approx(1.0)  # the first gather waits for no compute before it
    hidden = fsdp_overhead([FsdpUse(3.0, 1.0, 0.5, backward=True)] * 4, prefetch=1)
    assert hidden.bwd_s == pytest.approx(0.0)
    assert hidden.once_s == pytest.approx(1.0 + 0.5)  # first gather, last reduce-scatter
    on_demand = fsdp_overhead([FsdpUse(3.0, 1.0, 0.0, backward=False)] * 4, prefetch=0)
    assert on_demand.fwd_s == pytest.approx(4 * 1.0)


def test_collectives_in_flight_share_the_links() -> None:
    """A gather and a reduce-scatter in flight together share the links' time equally.

    Two backward units of 1 s compute, gathered on demand (prefetch 0): each gather
    takes 2 s alone, 1 s of it bytes on the links (the rest fixed costs, paid after),
    each reduce-scatter 1 s, all bytes. The first gather runs alone: ready at 2 s, the
    unit computes until 3 s. Then the next gather and the first reduce-scatter start
    together at 3 s: 2 s of bytes at half rate each, both done at 5 s, the gather
    ready at 6 s: a 3 s wait (2 s one after the other). Every later unit waits 3 s the
    same way, so the steady backward waits 3 + 3 s; the first microbatch waited 2 + 3 s,
    less than that, and the last reduce-scatter, alone, ends 1 s after the compute.
    """
    uses = [
        FsdpUse(1.0, 2.0, 1.0, backward=True, gather_wire_s=1.0, scatter_wire_s=1.0)
        for _ in range(2)
    ]
    sh = fsdp_overhead(uses, prefetch=0)
    assert sh.bwd_s == pytest.approx(3.0 + 3.0)
    assert sh.once_s == pytest.approx(1.0)


def test_search_enumerates_sharding() -> None:
    res = load_scenario(SCENARIOS / "p5-llama3-8b.yaml", ["cluster.count=2"])
    cands = layouts_of(res, domain_ranks=8)
    seen = {(c.par.zero, c.layout.shard, c.layout.dp) for c in cands if c.layout.tp == 1}
    assert {(z, 16, 16) for z in range(4)} <= seen
    assert {(2, 8, 16), (3, 8, 16)} <= seen  # HSDP: one node's GPUs per shard group
    assert (1, 8, 16) not in seen


def test_sm_share_closed_form() -> None:
    """Compute under a collective that takes f of the SMs runs at 1 - f of its speed."""
    from clustersim.search.templates_time import sm_lost_s as _sm_lost_s

    # f 0.25, 3 s of compute, 1 s of it under a collective: a quarter of that second lost.
    assert _sm_lost_s(0.25, 1.0, 3.0, 0.0) == pytest.approx(0.25)
    # Only the compute share of the overlap counts (1 s blocking comm in a 5 s pass).
    assert _sm_lost_s(0.25, 2.5, 3.0, 1.0) == pytest.approx(0.25 * 2.5 * 4 / 5)
    # A collective over the whole pass slows all of its compute 1/(1 - f): 3 s -> 4 s.
    assert _sm_lost_s(0.25, 10.0, 3.0, 1.0) == pytest.approx(1.0)
    assert _sm_lost_s(0.0, 10.0, 3.0, 1.0) == 0.0


def test_sm_share_in_the_estimate() -> None:
    """GPU ZeRO-3: the SMs NCCL takes slow the estimate as they slow the simulation."""
    sets = ["parallelism.zero=3", "training.global_batch_size=16"]
    on = load_scenario(SCENARIOS / "p5-llama3-8b.yaml", sets)
    off = load_scenario(
        SCENARIOS / "p5-llama3-8b.yaml", [*sets, "cluster.chip.collective_sm_fraction=0"]
    )
    assert on.chip.collective_sm_fraction == pytest.approx(16 / 132, abs=1e-3)
    est = [estimate_resolved(r) for r in (on, off)]
    assert est[0].interference_s > 0 and est[1].interference_s == 0
    assert est[0].step_time_s > est[1].step_time_s
    assert est[0].compute_s == est[1].compute_s
