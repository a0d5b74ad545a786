"""Selective recompute by module (Megatron-Core's recompute_modules), the precision-aware
optimizer's BF16 moments, and the MoE layer's saved activations, against hand counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim import catalog
from clustersim.scenario.models import ParallelismCfg, TrainingCfg
from clustersim.workload import make_layout, memory_per_rank
from clustersim.workload.dims import make_dims
from clustersim.workload.layers import LayerBlocks, moe_sublayer
from clustersim.workload.memory import layer_activation_bytes
from clustersim.workload.moe import moe_activation_bytes, stage_routing
from clustersim.workload.ops import Block
from clustersim.workload.program import Kind, Phase

from .helpers import check_refuses, tiny_moe_scenario

DSV3 = catalog.model("deepseek-v3")


def _blocks(recompute: str, modules: frozenset[str]) -> LayerBlocks:
    """DeepSeek-V3 at tp 2, ep 8 on 16 ranks, BF16, sequence 512."""
    par = ParallelismCfg(tp=2, ep=8, etp=1)
    train = TrainingCfg(seq_len=512, global_batch_size=8)
    layout = make_layout(par, 16, 1)
    dm = make_dims(DSV3, par, train, layout)
    part = moe_sublayer(DSV3, par, train, layout)
    return LayerBlocks(
        DSV3, dm, precision="bf16", recompute=recompute, modules=modules, moe_part=part
    )


def _names(block: Block) -> list[str]:
    return [t[1] for t in block.recompute]


def _flops(tpls: tuple[object, ...] | list[object]) -> float:
    return sum(t[3].tensor_flops for t in tpls if t[3] is not None)  # type: ignore[index,attr-defined]


def test_mla_up_proj_and_mlp_rerun_exactly_those_modules() -> None:
    """The recipe's [mla_up_proj, mlp]: every layer reruns its latent norms, up-projections
    and RoPE; a dense layer its MLP too (not the residual add); an MoE layer nothing of
    its MoE sublayer, so no all-to-all is rerun."""
    blocks = _blocks("selective", frozenset({"mla_up_proj", "mlp"}))
    up = ["attn.latent_norm", "attn.q_up", "attn.kv_up", "attn.rope"]
    assert _names(blocks.moe) == up  # type: ignore[arg-type]
    dense = _names(blocks.dense)
    assert dense[:4] == up
    assert "mlp.residual" not in dense and {"mlp.norm", "mlp.up", "mlp.act", "mlp.down"} <= set(
        dense
    )
    # The recomputed FLOPs are those of the up-projections (and the dense MLP's linears).
    fwd = {t[1]: t for t in blocks.dense.fwd}
    want = _flops([fwd["attn.q_up"], fwd["attn.kv_up"]])
    assert _flops(blocks.moe.recompute) == pytest.approx(want)  # type: ignore[union-attr]
    want += _flops([fwd["mlp.up"], fwd["mlp.down"]])
    assert _flops(blocks.dense.recompute) == pytest.approx(want)
    assert all(t[2] == Phase.RECOMPUTE for t in blocks.moe.recompute)  # type: ignore[union-attr]


def test_moe_recompute_reruns_the_all_to_alls_and_default_is_the_core() -> None:
    moe = _blocks("selective", frozenset({"moe"})).moe
    assert moe is not None
    kinds = [t[0] for t in moe.recompute]
    assert Kind.COLLECTIVE in kinds or Kind.ASYNC_COLLECTIVE in kinds
    names = _names(moe)
    assert "mlp.norm" not in names and "mlp.residual" not in names
    assert "moe.shared.up" in names and "moe.experts.act" in names
    core = _blocks("selective", frozenset({"core_attn"})).moe
    assert core is not None and all(n.startswith("attn.core") for n in _names(core))
    act = _blocks("selective", frozenset({"moe_act", "layernorm"})).moe
    assert act is not None and _names(act) == ["attn.norm", "mlp.norm", "moe.experts.act"]


def test_moe_activation_memory_by_hand() -> None:
    """bf16 and FP8: norm input and output, FP32 scores, expert rows (input, gate and up,
    down input) and the shared expert; no combined tokens (the probabilities are
    applied in the activation)."""
    par = ParallelismCfg(tp=2, ep=8, etp=1)
    train = TrainingCfg(seq_len=512, global_batch_size=8)
    layout = make_layout(par, 16, 1)
    moe = DSV3.moe
    assert moe is not None
    route = stage_routing(DSV3, par, train, layout, cfg=None)
    rows = route.expert_rows * route.local_experts
    Ts, T, h, f, E = 256, 512, DSV3.hidden, moe.expert_ffn_hidden, moe.experts
    fs = moe.shared_experts * f // 2
    for prec, lin in (("bf16", 2), ("fp8", 1)):
        dm = make_dims(DSV3, par, train.model_copy(update={"precision": prec}), layout)
        want = 4 * Ts * h + 4 * Ts * E + rows * (lin * h + 2 * 2 * f + lin * f)
        want += 2 * T * 2 * fs + lin * T * fs + (lin * Ts * h if lin == 1 else 0)
        assert moe_activation_bytes(dm, moe, route, "none") == want
        assert moe_activation_bytes(dm, moe, route, "selective", frozenset({"moe"})) == 4 * Ts * h
        no_act = moe_activation_bytes(dm, moe, route, "selective", frozenset({"moe_act"}))
        assert no_act == want - lin * rows * f
        assert moe_activation_bytes(dm, moe, route, "full") == 0


def test_dense_fp8_keeps_one_byte_linear_inputs() -> None:
    """Classic GPT shape, FP8: 32 - (2 norm outputs + the down input) + O's FP8 copy."""
    model = catalog.model("megatron-1.7b")
    assert model.activation == "gelu"
    par = ParallelismCfg(tp=1)
    train = TrainingCfg(seq_len=2048, global_batch_size=1, precision="fp8")
    layout = make_layout(par, 1, 1)
    dm = make_dims(model, par, train, layout)
    bf16 = make_dims(model, par, train.model_copy(update={"precision": "bf16"}), layout)
    T, h, f = 2048, model.hidden, model.ffn_hidden
    saved = 2 * T * h + T * f - T * h  # two normed inputs and the down input at 1 B; O's copy
    assert layer_activation_bytes(bf16, "none") - layer_activation_bytes(dm, "none") == saved


def test_bf16_moments_take_8_bytes_per_parameter() -> None:
    """Mixtral-8x7B at ep 8, ZeRO-1: Megatron's precision-aware optimizer (FP32 master,
    BF16 moments) holds 4 + 2 + 2 B per parameter of its shard, against 12."""
    model = catalog.model("mixtral-8x7b")
    par = ParallelismCfg(tp=1, pp=1, ep=8, zero=1)
    layout = make_layout(par, 8, 1)
    fp32 = TrainingCfg(seq_len=4096, global_batch_size=8)
    bf16 = TrainingCfg(seq_len=4096, global_batch_size=8, optimizer_moments="bf16")
    a = memory_per_rank(model, par, fp32, layout, 0)
    b = memory_per_rank(model, par, bf16, layout, 0)
    assert b.optimizer * 12 == a.optimizer * 8
    assert (a.weights, a.grads, a.activations) == (b.weights, b.grads, b.activations)


SCENARIO = tiny_moe_scenario("recompute-modules", "tp: 1, pp: 1, ep: 8, zero: 1")


@pytest.mark.parametrize(
    ("sets", "key"),
    [
        (["parallelism.recompute_modules=[mla_up_proj]"], "parallelism.recompute_modules"),
        (
            ["parallelism.recompute=full", "parallelism.recompute_modules=[moe]"],
            "parallelism.recompute_modules",
        ),
        (["parallelism.recompute_modules=[attention]"], "parallelism.recompute_modules"),
        (["parallelism.recompute_modules=[]"], "parallelism.recompute_modules"),
        (
            ["model.moe=null", "parallelism.ep=1", "parallelism.recompute_modules=[moe_act]"],
            "parallelism.recompute_modules",
        ),
        (["parallelism.recompute_modules=[shared_experts]"], "parallelism.recompute_modules"),
        (["training.optimizer_moments=fp16"], "training.optimizer_moments"),
    ],
)
def test_bad_input_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sets: list[str], key: str
) -> None:
    check_refuses(tmp_path, capsys, SCENARIO, sets, key)


def test_recipe_modules_run_end_to_end(tmp_path: Path) -> None:
    from clustersim.scenario.load import load_scenario
    from clustersim.sim.run import simulate

    sets = ["parallelism.recompute_modules=[moe_act, layernorm]"]
    res = load_scenario(SCENARIO, sets)
    step = simulate(res, record=False).summary["step_time_s"]
    full = simulate(load_scenario(SCENARIO, ["parallelism.recompute=full"]), record=False)
    assert 0 < step < full.summary["step_time_s"]
