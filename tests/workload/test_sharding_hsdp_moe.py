"""Hybrid sharding (dp_shard < dp) of MoE models, as torchtitan runs FSDP2 with expert
parallelism: the dense state sharded over dp_shard, the routed experts' over one
replica's expert-data-parallel ranks (edp_shard), both all-reduced over dp_replicate.
Memory by hand, per-step traffic in closed form, folding, the estimate, bad input."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from clustersim.errors import ScenarioError
from clustersim.scenario import load_scenario
from clustersim.scenario.models import ParallelismCfg, TrainingCfg
from clustersim.search import layouts_of
from clustersim.search.estimate import estimate_resolved
from clustersim.sim import simulate
from clustersim.workload import Layout, build_programs, make_layout, memory_per_rank, validate
from clustersim.workload.program import Kind
from clustersim.workload.sharding import unit_parts

from .helpers import check_refuses, tiny_moe_scenario
from .test_moe import moe_model

# moe_model(): 4 layers, hidden 256, 4 heads of 64 (2 KV), 8 experts of width 256,
# vocabulary 4096. With ep 4 each rank holds two experts per layer.
H, F = 256, 256
ATTN = H * (4 + 2 * 2) * 64 + 4 * 64 * H
ROUTER, NORMS = H * 8, 2 * H
DENSE = 4 * (ATTN + NORMS + ROUTER) + 2 * 4096 * H + H  # layers; embedding, head, final norm
EXPERTS = 4 * 2 * 3 * H * F  # per rank: two experts of three matrices, four layers
HEAD = 4096 * H + H  # the largest FSDP unit (the LM head and the final norm)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _setup(
    zero: int, dp_shard: int, microbatches: int = 1, **over: object
) -> tuple[ParallelismCfg, TrainingCfg, Layout]:
    """16 ranks, tp 1, dp 16, ep 4: edp 4, one replica's part of it dp_shard / 4."""
    par = ParallelismCfg(tp=1, pp=1, ep=4, zero=zero, dp_shard=dp_shard, **over)  # type: ignore[arg-type]
    train = TrainingCfg(seq_len=256, global_batch_size=16 * microbatches)
    layout = make_layout(par, 16, 4)
    validate(moe_model(), par, train, layout)
    return par, train, layout


def test_groups() -> None:
    """A replica is tp*cp*dp_shard consecutive ranks; its EP groups lie inside it, and
    its ranks holding the same experts form edp_shard; dp_replicate is the same place
    in every replica, for the experts as for the dense part."""
    _, _, lay = _setup(3, 8)
    assert (lay.edp, lay.expert_shard, lay.replicas) == (4, 2, 2)
    assert lay.expert_shard_group == "edp_shard"
    assert lay.group("ep", 9) == (8, 9, 10, 11)
    assert lay.group("edp_shard", 9) == (9, 13)
    assert lay.group("edp", 9) == (1, 5, 9, 13)
    assert lay.group("dp_replicate", 9) == (1, 9)
    assert lay.group("dp_shard", 9) == tuple(range(8, 16))
    # Without replicas the experts shard over all of edp, as before.
    _, _, whole = _setup(3, 16)
    assert (whole.expert_shard_group, whole.expert_shard) == ("edp", 4)


@pytest.mark.parametrize(("dp_shard", "experts_over"), [(8, 2), (4, 1)])
def test_memory_hand_count(dp_shard: int, experts_over: int) -> None:
    """Dense state over dp_shard, experts' over dp_shard / ep ranks (1: held whole)."""
    full = DENSE + EXPERTS
    shard = _ceil(DENSE, dp_shard) + _ceil(EXPERTS, experts_over)
    m2 = memory_per_rank(moe_model(), *_setup(2, dp_shard), stage=0)
    # ZeRO-2: whole weights; the gradient shard and two buckets (each 64 MiB, more
    # than the stage's gradients: the buckets hold all of them); Adam on the shard.
    assert (m2.weights, m2.grads, m2.optimizer) == (2 * full, 2 * shard + 2 * full, 12 * shard)
    m3 = memory_per_rank(moe_model(), *_setup(3, dp_shard), stage=0)
    # ZeRO-3: the shard, the unit computing and one prefetched; the gradients of the
    # unit computing and of the one being reduce-scattered.
    assert (m3.weights, m3.grads, m3.optimizer) == (
        2 * shard + 2 * 2 * HEAD,
        2 * shard + 2 * 2 * HEAD,
        12 * shard,
    )


def _traffic(zero: int, dp_shard: int, m: int, **over: object) -> dict[tuple[str, str], float]:
    (prog,) = build_programs(moe_model(), *_setup(zero, dp_shard, m, **over))
    out: dict[tuple[str, str], float] = defaultdict(float)
    for ins in prog.instrs:
        if ins.kind in (Kind.COLLECTIVE, Kind.ASYNC_COLLECTIVE) and "dp" in ins.group:
            out[(ins.group, ins.collective)] += ins.nbytes
    return dict(out)


@pytest.mark.parametrize("m", [1, 3])
def test_traffic_closed_form(m: int) -> None:
    """Per step over each shard group: gathers of 2 x parameters x 2 B per microbatch
    (1 x without reshard after forward), reduce-scatters of the gradients x 2 B; over
    dp_replicate, once, every unit's dense shard and expert shard."""
    parts = unit_parts(moe_model(), _setup(3, 8)[2], 0, "layer")
    assert sum(d for d, _ in parts.values()) == DENSE
    assert sum(e for _, e in parts.values()) == EXPERTS
    replica = sum(_ceil(2 * d, 8) + _ceil(2 * e, 2) for d, e in parts.values())
    assert _traffic(3, 8, m) == {
        ("dp_shard", "all_gather"): m * 2 * 2 * DENSE,
        ("edp_shard", "all_gather"): m * 2 * 2 * EXPERTS,
        ("dp_shard", "reduce_scatter"): m * 2 * DENSE,
        ("edp_shard", "reduce_scatter"): m * 2 * EXPERTS,
        ("dp_replicate", "all_reduce"): replica,
    }
    kept = _traffic(3, 8, m, fsdp={"reshard_after_forward": False})
    assert kept[("dp_shard", "all_gather")] == m * 2 * DENSE
    assert kept[("edp_shard", "all_gather")] == m * 2 * EXPERTS
    # ZeRO-2: every microbatch's buckets (one per stream here), one gather after Adam.
    assert _traffic(2, 8, m) == {
        ("dp_shard", "reduce_scatter"): m * 2 * DENSE,
        ("edp_shard", "reduce_scatter"): m * 2 * EXPERTS,
        ("dp_shard", "all_gather"): 2 * DENSE,
        ("edp_shard", "all_gather"): 2 * EXPERTS,
        ("dp_replicate", "all_reduce"): _ceil(2 * DENSE, 8) + _ceil(2 * EXPERTS, 2),
    }
    # A replica holding its experts whole (ep = dp_shard) gathers none of them; their
    # gradients are all-reduced whole over the replicas.
    whole = _traffic(3, 4, m)
    assert ("edp_shard", "all_gather") not in whole
    replica = sum(_ceil(2 * d, 4) + 2 * e for d, e in parts.values())
    assert whole[("dp_replicate", "all_reduce")] == replica


def test_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ep must divide a replica's tp*cp*dp_shard ranks."""
    with pytest.raises(ScenarioError) as err:
        make_layout(ParallelismCfg(ep=8, zero=3, dp_shard=4), 16, 4)
    assert err.value.path == "parallelism.dp_shard" and "valid dp_shard: 8, 16" in str(err.value)
    text = tiny_moe_scenario("bad", "tp: 1, pp: 1, ep: 8, zero: 3", count=2)
    check_refuses(tmp_path, capsys, text, ["parallelism.dp_shard=4"], "parallelism.dp_shard")
    # Hybrid sharding still needs zero 2 or 3.
    check_refuses(
        tmp_path,
        capsys,
        text,
        ["parallelism.dp_shard=8", "parallelism.zero=1"],
        "parallelism.dp_shard",
    )


HSDP = tiny_moe_scenario("hsdp-moe", "tp: 1, pp: 1, ep: 4, zero: 3, dp_shard: 8", count=2)


@pytest.mark.parametrize("sets", [[], ["parallelism.zero=2"], ["parallelism.ep=8"]], ids=str)
def test_folded_agrees_with_detailed(sets: list[str]) -> None:
    """Two p5 nodes, a shard group per node: folded and detailed within 1%."""
    res = load_scenario(HSDP, sets)
    detailed = simulate(res, record=False, fidelity="detailed").summary["step_time_s"]
    folded = simulate(res, record=False, fidelity="folded").summary["step_time_s"]
    assert folded == pytest.approx(detailed, rel=0.01)


MIXTRAL = """
name: mixtral-hsdp
seed: 1
cluster: {instance: p5.48xlarge, count: 2}
model: {name: mixtral-8x7b, layers: 8}
parallelism: {tp: 1, pp: 1, ep: 4, zero: 3, recompute: full, dp_shard: 8}
training: {seq_len: 4096, global_batch_size: 32}
output: {trace: false, html: false}
"""


# Measured est/sim step-time ratios: 0.987, 0.987 and 0.996. The replicas' all-reduce
# of each MoE layer's expert shards (350 MB over EFA) makes the tail.
@pytest.mark.parametrize(
    "sets",
    [[], ["parallelism.ep=8"], ["parallelism.zero=2", "parallelism.ep=8"]],
    ids=str,
)
def test_estimate_within_3_percent(sets: list[str]) -> None:
    res = load_scenario(MIXTRAL, sets)
    sim = simulate(res, record=False, fidelity="detailed").summary
    est = estimate_resolved(res)
    assert est.step_time_s == pytest.approx(sim["step_time_s"], rel=0.03)
    assert est.compute_s == pytest.approx(sim["breakdown_s"]["compute"], rel=1e-6)


def test_search_enumerates_hybrid_sharding_for_moe() -> None:
    """One node's GPUs per shard group, where ep*etp divides them."""
    res = load_scenario(HSDP, ["training.global_batch_size=16"])
    cands = layouts_of(res, domain_ranks=8)
    hsdp = [c for c in cands if c.layout.replicas > 1 and c.fits]
    assert {(c.layout.ep, c.layout.shard) for c in hsdp if c.layout.tp == 1} >= {
        (1, 8),
        (4, 8),
        (8, 8),
    }
    assert all((c.layout.tp * c.layout.cp * c.layout.shard) % (c.layout.ep * c.layout.etp) == 0
               for c in hsdp)  # fmt: skip
    assert not any(c.layout.ep == 16 for c in hsdp)
