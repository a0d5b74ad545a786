"""torchtitan's eager and compiled elementwise kernels (``software.compile``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.catalog.stacks import describe_stack
from clustersim.cli import main
from clustersim.errors import ScenarioError
from clustersim.hardware.work import Work
from clustersim.scenario import load_scenario
from clustersim.search.estimate import estimate_resolved
from clustersim.sim import simulate
from clustersim.sim.result import Result
from clustersim.workload.dims import Dims
from clustersim.workload.elementwise import FUSED, Elementwise
from clustersim.workload.ops import Block, Tpl, attention_part, compose, mlp_part
from clustersim.workload.titan import elementwise_for, titan_elementwise

# Llama-3-8B (h 4096, 32 query and 8 KV heads of 128, MLP 14336), one sequence of 8192, TP 1.
T, H, FFN = 8192, 4096, 14336
R = T * H  # the residual stream; q is as wide (32 x 128), k and v a quarter
F = T * FFN
DM = Dims(
    tp=1,
    cp=1,
    micro=1,
    seq=T,
    hidden=H,
    heads=32,
    kv_heads=8,
    head_dim=128,
    ffn=FFN,
    vocab=128256,
    vocab_padded=128256,
    sequence_parallel=False,
    swiglu=True,
    layernorm=False,
    learned_positions=False,
)
ELEMENTWISE = (
    "attn.norm",
    "attn.split",
    "attn.rope",
    "attn.residual",
    "mlp.norm",
    "mlp.act",
    "mlp.up.sum",
    "mlp.residual",
)


def _block(ew: Elementwise) -> Block:
    return compose(
        attention_part(DM, "bf16", "none", "flash", ew), mlp_part(DM, "bf16", ew), "none"
    )


def _elementwise(tpls: tuple[Tpl, ...]) -> list[tuple[str, Work]]:
    """The (name, work) of each elementwise kernel in ``tpls``."""
    out = []
    for _, name, _, work, *_ in tpls:
        if work is not None and any(name == op or name.startswith(f"{op}.") for op in ELEMENTWISE):
            out.append((name, work))
    return out


def _count(ew: Elementwise) -> tuple[int, float, int, float]:
    """(kernels, HBM bytes) of the block's elementwise ops, forward then backward."""
    b = _block(ew)
    fwd, bwd = _elementwise(b.fwd), _elementwise(b.bwd)
    return len(fwd), sum(w.hbm_bytes for _, w in fwd), len(bwd), sum(w.hbm_bytes for _, w in bwd)


LLAMA = "model: {name: llama3-8b, layers: 2}\n"


def _scenario(software: str = "stack: torchtitan", model: str = LLAMA) -> str:
    """Llama-3-8B cut to 2 layers, FSDP over one p5.48xlarge."""
    return (
        "name: s\ncluster: {instance: p5.48xlarge, count: 1}\n"
        "parallelism: {dp: 8, zero: 3, fsdp: {unit: layer}}\n"
        f"software: {{{software}}}\ntraining: {{seq_len: 4096, global_batch_size: 8}}\n" + model
    )


def _step(text: str) -> float:
    result = simulate(load_scenario(text), record=False)
    assert isinstance(result, Result)
    return float(result.summary["step_time_s"])


def test_eager_llama3_8b_block_against_a_hand_count() -> None:
    kernels_f, bytes_f, kernels_b, bytes_b = _count(titan_elementwise(DM, compiled=False))
    # Forward: 2 norms (4 B of R and the weight each), 3 split copies (4 B of q, k, v: 6R),
    # RoPE of q and k (3 kernels each, 20 B: 25R), 2 residual adds (6 B each), silu and
    # the multiply (4 + 6 B of F).
    assert kernels_f == 2 + 3 + 6 + 2 + 2
    assert bytes_f == (4 + 4 + 6 + 25 + 6 + 6) * R + 2 * 2 * H + 10 * F
    # Backward: 2 norms (dx 6 B and dweight 4 B, two kernels each), the QKV cat (6R), RoPE
    # (25R), the residual stream's two gradient sums (6 B each), the SwiGLU's three kernels
    # (18 B of F) and the sum of w1's and w3's input gradients (6 B of T*h).
    assert kernels_b == 4 + 1 + 6 + 2 + 3 + 1
    assert bytes_b == (10 + 10 + 6 + 25 + 6 + 6 + 6) * R + 18 * F


def test_compiled_fuses_each_chain_into_one_kernel() -> None:
    kernels_f, bytes_f, kernels_b, bytes_b = _count(titan_elementwise(DM, compiled=True))
    rope_tables = 2 * 2 * T * 128  # cos and sin, as the fused lowering's RoPE reads them
    # attention_norm, RoPE (q, k; v's copy fused in), add+ffn_norm, silu*mul, the last add
    assert kernels_f == 5
    assert bytes_f == (4 + (5 + 1) + 8 + 6) * R + 2 * 2 * H + rope_tables + 6 * F
    # Backward: the two norms (reading the residual gradient, and w3's input gradient,
    # too), RoPE, silu*mul; the adds pass their gradient on.
    assert kernels_b == 4
    assert bytes_b == (10 + 12 + 12) * R + 4 * 2 * H + 2 * rope_tables + 12 * F
    fused = _count(FUSED)
    assert fused[0] == 6 and kernels_f < fused[0] and bytes_f < fused[1] and bytes_b < fused[3]


def test_compiled_runs_the_fused_lowerings_kernels_where_inductor_fuses_as_megatron() -> None:
    compiled, fused = _block(titan_elementwise(DM, compiled=True)), _block(FUSED)
    mine, theirs = dict(_elementwise(compiled.fwd)), dict(_elementwise(fused.fwd))
    for op in ("attn.norm", "mlp.act", "mlp.residual"):  # one kernel each, as Megatron's
        assert mine[op] == theirs[op]
    mine, theirs = dict(_elementwise(compiled.bwd)), dict(_elementwise(fused.bwd))
    assert mine["mlp.act"] == theirs["mlp.act"]  # silu*mul's backward: twice its forward


def test_torchtitan_runs_w1_and_w3_as_two_linears_in_both_modes() -> None:
    for compiled in (False, True):
        names = [t[1] for t in _block(titan_elementwise(DM, compiled)).fwd]
        assert "mlp.up.w1" in names and "mlp.up.w3" in names and "mlp.up" not in names
    assert "mlp.up" in [t[1] for t in _block(FUSED).fwd]


def test_other_layer_kinds_keep_the_fused_lowering() -> None:
    moe = load_scenario(
        _scenario(model="model: {name: mixtral-8x7b, layers: 2}").replace("dp: 8,", "dp: 8, ep: 8,")
    ).model
    gelu = load_scenario(_scenario(model="model: {name: llama3-8b, layers: 2, activation: gelu}"))
    for model in (moe, gelu.model):
        assert elementwise_for("eager", model, DM, "bf16", "flash") is FUSED
    llama = load_scenario(_scenario()).model
    assert elementwise_for("eager", llama, DM, "fp8", "flash") is FUSED
    assert elementwise_for("eager", llama, DM, "bf16", "flash") is not FUSED


SOFTWARE = ("stack: torchtitan", "stack: torchtitan, compile: true")


def test_torchtitan_is_eager_by_default_and_slower_than_compiled() -> None:
    assert load_scenario(_scenario()).scenario.software.compile is False
    eager = _step(_scenario())
    compiled = _step(_scenario(SOFTWARE[1]))
    assert eager > compiled
    # ``clustersim search``'s estimate runs the same kernels
    est = [estimate_resolved(load_scenario(_scenario(sw))).step_time_s for sw in SOFTWARE]
    assert est[0] > est[1]
    megatron = load_scenario(_scenario("stack: megatron-core")).scenario.software.compile
    assert megatron is None  # no switch: the fused kernels


def test_a_stack_with_only_fused_kernels_refuses_compile_false() -> None:
    text = _scenario("stack: megatron-core, compile: false")
    with pytest.raises(ScenarioError) as err:
        load_scenario(text)
    assert err.value.path == "software.compile" and "no eager path" in str(err.value)
    same = _scenario("stack: megatron-core")
    on = _scenario("stack: megatron-core, compile: true")
    assert _step(on) == _step(same)


def test_run_exits_2_on_a_bad_compile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scen = tmp_path / "s.yaml"
    for bad in ("maybe", "1.5"):
        scen.write_text(_scenario(f"stack: torchtitan, compile: {bad}"))
        assert main(["run", str(scen), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("clustersim: error: software.compile:")
    scen.write_text(_scenario("stack: megatron-core, compile: false"))
    assert main(["run", str(scen), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and err[0].startswith("clustersim: error: software.compile:")
        and "no eager path" in err[0]
    )


def test_the_stack_rule_names_its_source() -> None:
    titan, core = describe_stack("torchtitan"), describe_stack("megatron-core")
    assert titan["compile"] is False and "CompileConfig.enable = False" in str(
        titan["compile_source"]
    )
    assert core["compile"] is None and "compile_source" not in core
