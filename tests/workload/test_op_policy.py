"""torchtitan's per-op selective checkpointing (``recompute_policy: op``): what it keeps
and what it reruns, against hand counts for Llama-3-8B, and the settings it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.scenario import load_scenario
from clustersim.workload import Dims, build_programs, layer_activation_bytes, make_dims
from clustersim.workload.op_policy import op_split
from clustersim.workload.program import Kind, Phase
from clustersim.workload.recompute import OP_POLICY

from .helpers import check_refuses, llama3_8b, setup

MIB = 2**20

TORCHTITAN = """\
name: tt
cluster: {instance: p5.48xlarge, count: 1}
model: llama3-8b
software: {stack: torchtitan}
parallelism: {tp: 2, zero: 1, recompute: selective}
training: {seq_len: 8192, global_batch_size: 32}
"""


def _dims(tp: int) -> Dims:
    par, train, lay = setup(8, 8, tp=tp, seq_len=8192, global_batch_size=8)
    return make_dims(llama3_8b(), par, train, lay)


def test_llama_block_keeps_wq_wv_w1_w2() -> None:
    kept, rerun = op_split(_dims(1))
    assert [m.name for m in kept] == ["attn.q", "attn.v", "mlp.w1", "mlp.w2"]
    assert [m.name for m in rerun] == ["attn.k", "attn.out", "mlp.w3"]


def test_bytes_kept_per_layer_by_hand() -> None:
    # Llama-3-8B, one 8192-token sequence, tp 1: the block's input 2*T*h = 64 MiB; wq's
    # output 2*T*4096 = 64 MiB; wv's 2*T*1024 = 16 MiB; O 64 MiB and the log-sum-exp
    # 4*T*32 = 1 MiB; w1's 2*T*14336 = 224 MiB; w2's 2*T*4096 = 64 MiB.
    assert layer_activation_bytes(_dims(1), "selective", OP_POLICY) == 497 * MIB
    # tp 8 with sequence parallelism (T_sp = 1024): the input 8 MiB; wq 2*T*512 = 8 MiB;
    # wv 2*T*128 = 2 MiB; O 8 MiB and the log-sum-exp 4*T*4 = 1/8 MiB; w1 2*T*1792 = 28
    # MiB; w2's partial sum over the whole sequence, 2*T*4096 = 64 MiB; wo's and w2's
    # reduce-scatter outputs, 8 MiB each.
    assert layer_activation_bytes(_dims(8), "selective", OP_POLICY) == 134.125 * MIB


def test_program_reruns_wk_wo_w3() -> None:
    model = llama3_8b(layers=2)
    par, train, lay = setup(
        2, 1, tp=2, recompute="selective", recompute_policy="op", seq_len=8192, global_batch_size=1
    )
    prog = build_programs(model, par, train, lay)[0]
    rec = [
        i
        for i in prog.instrs
        if i.phase == Phase.RECOMPUTE and i.kind == Kind.COMPUTE and i.layer == 0
    ]
    gemms = {i.name: i.work.tensor_flops for i in rec if i.work and i.work.tensor_flops}
    T, h, f, g, ad = 8192, 4096, 14336 // 2, 8 // 2 * 128, 32 // 2 * 128
    assert gemms == {
        "attn.k": 2 * T * h * g,
        "attn.out": 2 * T * ad * h,
        "mlp.w3": 2 * T * h * f,
    }
    names = [i.name for i in rec]
    assert {"attn.norm", "attn.rope", "mlp.norm", "mlp.act"} <= set(names)
    # the sequence-parallel all-gathers rerun; the reduce-scatters' outputs are kept
    colls = [
        i.collective
        for i in prog.instrs
        if i.phase == Phase.RECOMPUTE and i.layer == 0 and i.kind != Kind.COMPUTE
    ]
    assert colls and set(colls) == {"all_gather"}


def test_the_stack_picks_the_policy(tmp_path: Path) -> None:
    assert load_scenario(TORCHTITAN).scenario.parallelism.recompute_policy == "op"
    megatron = TORCHTITAN.replace("software: {stack: torchtitan}\n", "")
    assert load_scenario(megatron).scenario.parallelism.recompute_policy == "modules"
    listed = TORCHTITAN.replace("recompute: selective", "recompute: selective, "
                                "recompute_modules: [mlp]")  # fmt: skip
    assert load_scenario(listed).scenario.parallelism.recompute_policy == "modules"
    full = TORCHTITAN.replace("recompute: selective", "recompute: full")
    assert load_scenario(full).scenario.parallelism.recompute_policy is None


@pytest.mark.parametrize(
    "update",
    [
        {"parallelism.attention": "unfused"},
        {"training.precision": "fp8"},
        {"parallelism.cp": 2},
        {"model": "qwen3-30b-a3b"},
    ],
)
def test_the_stack_default_falls_back_where_op_is_not_modelled(update: dict[str, object]) -> None:
    """A torchtitan run left at ``recompute: selective`` is not refused where the per-op
    policy is not modelled: it runs Megatron's module rule (a named ``op`` is refused)."""
    sets = [f"{k}={v}" for k, v in update.items()]
    res = load_scenario(TORCHTITAN, tuple(sets))
    assert res.scenario.parallelism.recompute_policy == "modules"


@pytest.mark.parametrize(
    "sets",
    [
        ["parallelism.recompute=full", "parallelism.recompute_policy=op"],
        ["parallelism.recompute_modules=[mlp]", "parallelism.recompute_policy=op"],
        ["parallelism.attention=unfused", "parallelism.recompute_policy=op"],
        ["training.precision=fp8", "parallelism.recompute_policy=op"],
        ["parallelism.cp=2", "parallelism.recompute_policy=op"],
        ["model=qwen3-30b-a3b", "parallelism.recompute_policy=op"],
        ["parallelism.recompute_policy=per_op"],
    ],
)
def test_meaningless_combinations_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sets: list[str]
) -> None:
    check_refuses(tmp_path, capsys, TORCHTITAN, sets, "parallelism.recompute_policy")
