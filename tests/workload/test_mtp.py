"""DeepSeek-V3's multi-token-prediction module (``model.mtp_layers``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clustersim.scenario import load_scenario
from clustersim.sim import simulate
from clustersim.workload import build_programs, make_layout
from clustersim.workload.dims import chunk_layers
from clustersim.workload.memory import param_count, stage_param_count

from .helpers import check_refuses, tiny_moe_scenario

SCENARIO = tiny_moe_scenario(
    "mtp",
    "tp: 2, pp: 2, ep: 2, zero: 1, recompute: none",
    layers=8,
    moe="experts: 16, top_k: 2, expert_ffn_hidden: 1024, dense_layers: 1",
)


def _setup(*sets: str) -> tuple[Any, Any, list[Any]]:
    res = load_scenario(SCENARIO, list(sets))
    sc = res.scenario
    layout = make_layout(sc.parallelism, res.ranks, res.ranks_per_chip, res.ranks_per_node)
    progs = build_programs(res.model, sc.parallelism, sc.training, layout, moe=sc.moe)
    return res, layout, progs


def _flops(instrs: list[Any], **match: Any) -> float:
    return sum(
        i.work.tensor_flops
        for i in instrs
        if i.work is not None and all(getattr(i, k) == v for k, v in match.items())
    )


def test_the_module_is_one_more_layer_on_the_last_stage_with_its_projection_and_head() -> None:
    """Per microbatch the last stage adds a layer like the model's last, the 2h x h
    projection (6 T 2h h/tp FLOPs forward and backward) and a second LM head pass."""
    res, layout, base = _setup()
    res_m, layout_m, mtp = _setup("model.mtp_layers=1")
    model = res_m.model
    assert list(chunk_layers(model, layout_m, 1, 0))[-1] == model.layers  # the MTP block
    assert param_count(model) == param_count(res.model)
    assert stage_param_count(model, layout_m, 1) > stage_param_count(res.model, layout, 1)
    n_mb, T, h = 32 // layout.dp, 2048, 1024
    last = mtp[1].instrs
    layer = _flops(last, layer=model.layers - 1)  # a main MoE layer, all microbatches
    mtp_layer = _flops(last, layer=model.layers)
    proj = 6 * T * 2 * h * (h // 2) * n_mb
    assert mtp_layer == pytest.approx(layer + proj, rel=1e-9)
    head = _flops(base[1].instrs, layer=-1)
    assert _flops(last, layer=-1) == pytest.approx(2 * head, rel=1e-9)
    assert _flops(mtp[0].instrs) == pytest.approx(_flops(base[0].instrs), rel=1e-9)


def test_mtp_costs_time_and_folds() -> None:
    def run(*sets: str, fidelity: Any = "detailed") -> float:
        res = load_scenario(SCENARIO, list(sets))
        return float(simulate(res, fidelity=fidelity, record=False).summary["step_time_s"])

    base, mtp = run(), run("model.mtp_layers=1")
    assert mtp > base
    assert run("model.mtp_layers=1", fidelity="folded") == pytest.approx(mtp, rel=0.01)


def test_bad_input_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check_refuses(tmp_path, capsys, SCENARIO, ["model.mtp_layers=-1"], "model.mtp_layers")
