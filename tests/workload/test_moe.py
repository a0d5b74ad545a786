"""Mixture of experts: routing, all-to-all bytes, FLOPs, memory, layout checks, skew."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clustersim import catalog
from clustersim.catalog.schema import ModelSpec, MoESpec
from clustersim.scenario import load_scenario
from clustersim.scenario.models import MoECfg, ParallelismCfg, TrainingCfg
from clustersim.sim import simulate
from clustersim.sim.folding import replica_groups, representatives
from clustersim.workload import Kind, Layout, build_programs, make_layout, memory_per_rank
from clustersim.workload.moe import ROW_TILE, expert_loads, routing

from .helpers import check_refuses, setup, tiny_moe_scenario


def moe_model(**moe: Any) -> ModelSpec:
    spec = {"experts": 8, "top_k": 2, "expert_ffn_hidden": 256, **moe}
    return ModelSpec(
        name="tiny-moe",
        layers=4,
        hidden=256,
        heads=4,
        kv_heads=2,
        ffn_hidden=512,
        vocab=4096,
        max_seq_len=1024,
        moe=MoESpec(**spec),
    )


# -- token loads ---------------------------------------------------------------------


@pytest.mark.parametrize("skew", [0.0, 0.5, 1.0, 2.0, 4.0])
def test_loads_conserve_tokens_and_respect_one_copy_per_token(skew: float) -> None:
    loads = expert_loads(64, 8, 1000.0, skew, seed=3)
    assert loads.sum() == pytest.approx(8000.0)
    assert loads.max() <= 1000.0 + 1e-9


def test_zero_skew_is_the_balanced_load() -> None:
    layout = Layout(tp=1, pp=1, dp=4, cp=1, ep=4, ranks=4, ranks_per_chip=1)
    moe = moe_model().moe
    assert moe is not None
    skewed = routing(moe, 256, layout, MoECfg(skew=0.0))
    balanced = routing(moe, 256, layout, MoECfg(balanced=True, skew=2.0))
    assert skewed == balanced
    assert balanced.sent == balanced.received == 256 * 2
    assert balanced.expert_rows == 256  # 4 ranks x 256 tokens x 2 / 8 experts


def test_capacity_factor_drops_the_excess() -> None:
    layout = Layout(tp=1, pp=1, dp=4, cp=1, ep=4, ranks=4, ranks_per_chip=1)
    moe = moe_model().moe
    assert moe is not None
    free = routing(moe, 256, layout, MoECfg(skew=1.5))
    capped = routing(moe, 256, layout, MoECfg(skew=1.5, capacity_factor=1.0))
    assert capped.kept < 1.0
    assert capped.received <= 2 * 256  # two experts per rank, each at most its share
    assert capped.received < free.received


def test_padding_to_the_row_tile() -> None:
    layout = Layout(tp=1, pp=1, dp=4, cp=1, ep=4, ranks=4, ranks_per_chip=1)
    moe = moe_model().moe
    assert moe is not None
    few = routing(moe, 10, layout)  # 10 tokens x 4 ranks x 2 / 8 = 10 per expert
    assert few.expert_rows == ROW_TILE


# -- programs ------------------------------------------------------------------------


def _programs(model: ModelSpec, ranks: int, **par: Any) -> tuple[list[Any], Layout]:
    cfg, train, layout = setup(ranks, 1, seq_len=256, global_batch_size=ranks, **par)
    return build_programs(model, cfg, train, layout), layout


def test_dispatch_bytes_closed_form_and_conservation() -> None:
    """Balanced: each rank's buffer is tokens x top_k x hidden x 2 B, of which
    (ep-1)/ep leaves the rank; every dispatch has its combine, forward and backward."""
    model = moe_model()
    progs, layout = _programs(model, 4, ep=4)
    a2a = [i for i in progs[0].instrs if i.kind == Kind.COLLECTIVE and i.group == "ep"]
    assert {i.nbytes for i in a2a} == {256 * 2 * 256 * 2}
    off_rank = a2a[0].nbytes * (layout.ep - 1) / layout.ep
    assert off_rank == 256 * 2 * 256 * 2 * 3 / 4
    for layer in range(model.layers):
        names = [i.name for i in a2a if i.layer == layer]
        assert names.count("ep.all_to_all.dispatch") == names.count("ep.all_to_all.combine") == 2


def test_flops_follow_active_parameters() -> None:
    """Balanced routing, 256 rows per expert (no padding): hardware FLOPs are 6 per
    active matmul parameter and token, plus causal attention and the LM head."""
    model = moe_model()
    progs, _ = _programs(model, 4, ep=4, recompute="none")
    total = sum(i.work.tensor_flops for i in progs[0].instrs if i.work is not None) * 4
    h, s, tokens = 256, 256, 4 * 256
    attn = h * (4 + 2 * 2) * 64 + 4 * 64 * h
    active = attn + h * 8 + 2 * 3 * h * 256
    core = 3.5 * 2 * h * s  # forward QK^T and PV (2 h s/2 each), backward 2.5 times that
    per_token = 4 * (6.0 * active + core) + 6.0 * 4096 * h
    assert total == pytest.approx(per_token * tokens, rel=1e-9)


def test_expert_gradients_reduce_over_expert_data_parallel() -> None:
    model = moe_model()
    progs, layout = _programs(model, 8, ep=4)
    assert layout.edp == 2
    groups = {i.group for i in progs[0].instrs if i.kind == Kind.ASYNC_COLLECTIVE}
    assert groups == {"dp", "edp"}


def test_expert_groups_fold_like_the_layout() -> None:
    layout = make_layout(ParallelismCfg(tp=2, pp=2, ep=2, etp=1), 16, 4)
    for name in ("ep", "etp", "edp"):
        for stage in range(layout.pp):
            rows = replica_groups(layout, name, stage)
            expected = sorted(g for g in layout.groups(name) if layout.stage(g[0]) == stage)
            assert sorted(tuple(int(r) for r in row) for row in rows) == expected
            assert tuple(rows[0]) == layout.group(name, representatives(layout)[stage])


def test_ep_carved_out_of_dp_times_cp() -> None:
    layout = make_layout(ParallelismCfg(tp=2, cp=2, ep=4), 8, 4)
    assert layout.dp == 2
    assert layout.group("ep", 0) == (0, 2, 4, 6)  # etp = tp: stride tp over (cp, dp)


# -- memory ----------------------------------------------------------------------------


def test_mixtral_8x7b_memory_by_hand() -> None:
    """tp 1, pp 1, dp 8 = ep 8, ZeRO-1: each rank holds one expert per layer; the
    dense parameters' optimizer state is split over dp = 8, the experts' over edp = 1."""
    model = catalog.model("mixtral-8x7b")
    par = ParallelismCfg(tp=1, pp=1, ep=8, zero=1)
    train = TrainingCfg(seq_len=4096, global_batch_size=8)
    layout = make_layout(par, 8, 1)
    mem = memory_per_rank(model, par, train, layout, 0)
    h, L = 4096, 32
    attn = h * (32 + 2 * 8) * 128 + 32 * 128 * h
    dense = L * (attn + 2 * h + h * 8) + 2 * 32000 * h + h
    expert = L * 3 * h * 14336
    assert mem.weights == 2 * (dense + expert)
    assert mem.grads == 2 * (dense + expert)
    assert mem.optimizer == 12 * (-(-dense // 8) + expert)


# -- skew ---------------------------------------------------------------------------------

SCENARIO = tiny_moe_scenario(
    "moe-skew", "tp: 1, pp: 1, ep: 8, zero: 1", global_batch_size=16, balanced=False
)


def _step(*sets: str, fidelity: Any = "detailed") -> float:
    res = load_scenario(SCENARIO, list(sets))
    return float(simulate(res, fidelity=fidelity, record=False).summary["step_time_s"])


def test_zero_skew_gives_the_balanced_time_and_skew_slows_monotonically() -> None:
    balanced = _step("moe.balanced=true")
    assert _step("moe.skew=0") == balanced
    times = [_step(f"moe.skew={s}") for s in (0.0, 0.25, 0.5, 1.0, 1.5, 2.0)]
    assert times[0] == balanced
    assert all(b >= a for a, b in itertools.pairwise(times))
    assert times[-1] > 1.2 * balanced


def test_folded_agrees_with_detailed_under_skew() -> None:
    detailed = _step("moe.skew=1.0")
    folded = _step("moe.skew=1.0", fidelity="folded")
    assert folded == pytest.approx(detailed, rel=0.01)


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sets", "key"),
    [
        (["parallelism.ep=3"], "parallelism.ep"),  # does not divide dp x cp = 8
        (["parallelism.ep=8", "model.moe.experts=4"], "parallelism.ep"),  # above experts
        (["model.moe.top_k=20"], "model.moe"),
        (["model.moe=null", "parallelism.ep=2"], "parallelism.ep"),  # dense with ep > 1
        (["moe.capacity_factor=0"], "moe.capacity_factor"),
        (["moe.capacity_factor=-1"], "moe.capacity_factor"),
        (["parallelism.schedule=zigzag"], "parallelism.schedule"),
    ],
)
def test_bad_input_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sets: list[str], key: str
) -> None:
    check_refuses(tmp_path, capsys, SCENARIO, sets, key)


def test_every_moe_model_builds() -> None:
    for name in ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3"):
        model = catalog.model(name)
        assert model.moe is not None
        par = ParallelismCfg(tp=1, pp=1, ep=8)
        train = TrainingCfg(seq_len=512, global_batch_size=8)
        progs = build_programs(model, par, train, make_layout(par, 8, 1))
        assert np.isfinite(sum(i.nbytes for i in progs[0].instrs))


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_activations_in_flight_closed_form_matches_the_schedule(schedule: str) -> None:
    from clustersim.workload.memory import _held
    from clustersim.workload.schedules import get_schedule, peak_in_flight

    for pp, n_mb in ((1, 1), (4, 2), (4, 8), (8, 3)):
        layout = Layout(tp=1, pp=pp, dp=1, cp=1, ep=1, ranks=pp, ranks_per_chip=1)
        for stage in range(pp):
            order = get_schedule(schedule)(stage, pp, n_mb, 1)
            assert _held(schedule, stage, layout, n_mb, [7]) == peak_in_flight(order, [7])
