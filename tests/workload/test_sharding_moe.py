"""ZeRO-2/3 of MoE models: the routed experts sharded over expert data parallelism (edp),
the dense parts over dp_shard; memory by hand and per-step traffic in closed form."""

from __future__ import annotations

from collections import defaultdict

import pytest

from clustersim import catalog
from clustersim.errors import ScenarioError
from clustersim.scenario.models import ParallelismCfg, TrainingCfg
from clustersim.workload import build_programs, make_layout, memory_per_rank, validate
from clustersim.workload.program import Kind
from clustersim.workload.sharding import unit_parts

from .test_moe import moe_model

H, L = 4096, 32
ATTN = H * (32 + 2 * 8) * 128 + 32 * 128 * H
DENSE = L * (ATTN + 2 * H + H * 8) + 2 * 32000 * H + H  # attention, norms, router; embed, head
EXPERTS = L * 2 * 3 * H * 14336  # ep 4: two of the eight experts per layer on each rank
UNIT = ATTN + 2 * H + H * 8 + 2 * 3 * H * 14336  # the largest unit: one MoE layer


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _mixtral(zero: int, **over: object) -> tuple[float, float, float]:
    """tp 1, pp 1, dp 8, ep 4: edp 2 ranks hold the same experts."""
    model = catalog.model("mixtral-8x7b")
    par = ParallelismCfg(tp=1, pp=1, ep=4, zero=zero, **over)  # type: ignore[arg-type]
    train = TrainingCfg(seq_len=4096, global_batch_size=8)
    layout = make_layout(par, 8, 1)
    assert layout.edp == 2
    m = memory_per_rank(model, par, train, layout, 0)
    return m.weights, m.grads, m.optimizer


def test_mixtral_memory_hand_count_at_zero_2_and_3() -> None:
    shard = _ceil(DENSE, 8) + _ceil(EXPERTS, 2)  # dense over dp 8, experts over edp 2
    full = DENSE + EXPERTS
    assert _mixtral(1) == (2 * full, 2 * full, 12 * shard)
    buckets = 2 * 64 * 2**20
    assert _mixtral(2) == (2 * full, 2 * shard + buckets, 12 * shard)
    # The unit computing and one prefetched; the gradients of the one computing and of
    # the one being reduce-scattered.
    assert _mixtral(3) == (2 * shard + 2 * 2 * UNIT, 2 * shard + 2 * 2 * UNIT, 12 * shard)
    kept = _mixtral(3, fsdp={"reshard_after_forward": False})
    assert kept[0] == 2 * shard + 2 * full


def _traffic(zero: int, microbatches: int, **over: object) -> dict[tuple[str, str], float]:
    model = moe_model()  # 8 experts, 4 layers
    par = ParallelismCfg(tp=1, pp=1, ep=4, zero=zero, **over)  # type: ignore[arg-type]
    train = TrainingCfg(seq_len=256, global_batch_size=8 * microbatches)
    layout = make_layout(par, 8, 4)
    validate(model, par, train, layout)
    (prog,) = build_programs(model, par, train, layout)
    out: dict[tuple[str, str], float] = defaultdict(float)
    for ins in prog.instrs:
        if ins.kind in (Kind.COLLECTIVE, Kind.ASYNC_COLLECTIVE) and ins.group in (
            "dp", "dp_shard", "edp",
        ):  # fmt: skip
            out[(ins.group, ins.collective)] += ins.nbytes
    return dict(out)


@pytest.mark.parametrize("microbatches", [1, 3])
def test_moe_sharded_traffic_closed_form(microbatches: int) -> None:
    """Per microbatch: each unit's dense part gathered twice and reduce-scattered once over
    dp_shard, its experts over edp; ZeRO-2 reduce-scatters every microbatch."""
    h, f, m = 256, 256, microbatches
    attn = h * (4 + 2 * 2) * 64 + 4 * 64 * h
    dense = 4 * (attn + 2 * h + h * 8) + 2 * 4096 * h + h
    experts = 4 * 2 * 3 * h * f  # two experts per layer per rank (ep 4)
    parts = unit_parts(moe_model(), make_layout(ParallelismCfg(ep=4), 8, 4), 0, "layer")
    assert sum(d for d, _ in parts.values()) == dense
    assert sum(e for _, e in parts.values()) == experts
    assert _traffic(3, m) == {
        ("dp_shard", "all_gather"): m * 2 * 2 * dense,
        ("edp", "all_gather"): m * 2 * 2 * experts,
        ("dp_shard", "reduce_scatter"): m * 2 * dense,
        ("edp", "reduce_scatter"): m * 2 * experts,
    }
    assert _traffic(2, m) == {
        ("dp_shard", "reduce_scatter"): m * 2 * dense,
        ("edp", "reduce_scatter"): m * 2 * experts,
        ("dp_shard", "all_gather"): 2 * dense,
        ("edp", "all_gather"): 2 * experts,
    }


MIXTRAL = """
name: mixtral-fsdp
seed: 1
cluster: {instance: p5.48xlarge, count: 1}
model: {name: mixtral-8x7b, layers: 8}
parallelism: {tp: 1, pp: 1, ep: 4, zero: 3, recompute: full}
training: {seq_len: 4096, global_batch_size: 16}
output: {trace: false, html: false}
"""


@pytest.mark.parametrize("zero", [2, 3])
def test_moe_sharded_estimate_and_folding_agree_with_the_detailed_run(zero: int) -> None:
    from clustersim.scenario import load_scenario
    from clustersim.search.estimate import estimate_resolved
    from clustersim.sim import simulate

    res = load_scenario(MIXTRAL, [f"parallelism.zero={zero}"])
    detailed = simulate(res, record=False, fidelity="detailed").summary["step_time_s"]
    folded = simulate(res, record=False, fidelity="folded").summary["step_time_s"]
    assert folded == pytest.approx(detailed, rel=0.01)
    assert estimate_resolved(res).step_time_s == pytest.approx(detailed, rel=0.03)


def test_fsdp_with_overlapped_all_to_alls_is_refused() -> None:
    model = moe_model()
    par = ParallelismCfg(ep=4, zero=3, overlap_moe_a2a=True)
    with pytest.raises(ScenarioError) as err:
        validate(model, par, TrainingCfg(seq_len=256, global_batch_size=8), make_layout(par, 8, 4))
    assert err.value.path == "parallelism.overlap_moe_a2a"
