"""Multi-head latent attention: parameters, FLOPs, activation memory, against hand counts."""

from __future__ import annotations

import pytest

from clustersim import catalog
from clustersim.catalog.schema import MLASpec, ModelSpec
from clustersim.workload import (
    Kind,
    build_programs,
    layer_activation_bytes,
    make_dims,
    param_count,
    rank_param_count,
)
from clustersim.workload.flops import model_flops_per_token, model_matmul_params

from .helpers import setup

MLA = MLASpec(
    q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32
)


def mla_model(**over: object) -> ModelSpec:
    spec: dict[str, object] = {
        "name": "tiny-mla",
        "layers": 4,
        "hidden": 256,
        "heads": 8,
        "kv_heads": 8,
        "head_dim": 32,
        "ffn_hidden": 512,
        "vocab": 4096,
        "mla": MLA,
    }
    return ModelSpec.model_validate({**spec, **over})


def _attn_params(h: int, heads: int, m: MLASpec) -> int:
    down = h * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim)
    q_up = m.q_lora_rank * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
    kv_up = m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
    return down + q_up + kv_up + heads * m.v_head_dim * h + m.q_lora_rank + m.kv_lora_rank


def test_parameter_count_by_hand() -> None:
    model = mla_model()
    h = 256
    layer = _attn_params(h, 8, MLA) + 3 * h * 512 + 2 * h
    assert param_count(model) == 4 * layer + h + 2 * 4096 * h


def test_deepseek_v3_counts_671b_with_37b_active() -> None:
    model = catalog.model("deepseek-v3")
    assert param_count(model) == pytest.approx(671e9, rel=0.005)
    # 37B activated (arXiv 2412.19437); ours leaves out the input embedding (0.9B).
    assert model_matmul_params(model) == pytest.approx(37e9 - 0.93e9, rel=0.02)


def test_qwen3_head_dim_is_not_hidden_over_heads() -> None:
    model = catalog.model("qwen3-30b-a3b")
    assert model.head_dim == 128 != model.hidden // model.heads
    assert param_count(model) == pytest.approx(30.5e9, rel=0.01)
    assert param_count(catalog.model("qwen3-235b-a22b")) == pytest.approx(235e9, rel=0.01)
    assert param_count(catalog.model("mixtral-8x22b")) == pytest.approx(141e9, rel=0.01)


def test_mla_needs_kv_heads_equal_heads() -> None:
    with pytest.raises(ValueError, match="kv_heads must equal heads"):
        mla_model(kv_heads=4)


@pytest.mark.parametrize("tp", [1, 2])
def test_layer_flops_by_hand(tp: int) -> None:
    """Per token: 6 FLOPs per matmul parameter (the replicated down-projections run
    on each rank's sequence shard, so TP duplicates no work), plus causal flash
    attention per head: forward QK^T and PV, 2 d_qk s/2 and 2 d_v s/2; backward S,
    dQ and dK of d_qk, dP and dV of d_v."""
    model = mla_model()
    seq = 128
    par, train, layout = setup(tp, 1, tp=tp, seq_len=seq, global_batch_size=2, recompute="none")
    progs = build_programs(model, par, train, layout)
    h, heads, m = 256, 8, MLA
    down = h * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim)
    sharded = _attn_params(h, heads, m) - down - m.q_lora_rank - m.kv_lora_rank
    mlp = 3 * h * 512
    dqk, dv = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
    core = heads * seq * ((dqk + dv) + (3 * dqk + 2 * dv))
    vocab = -(-4096 // (128 * tp)) * 128 * tp
    per_token = 4 * (6.0 * (sharded + mlp + down) + core) + 6.0 * vocab * h
    tokens = 2 * seq
    total = sum(i.work.tensor_flops for i in progs[0].instrs if i.work is not None) * tp
    assert total == pytest.approx(per_token * tokens, rel=1e-9)


def test_tp_gathers_the_latents_not_the_hidden_state() -> None:
    model = mla_model()
    par, train, layout = setup(2, 1, tp=2, seq_len=128, global_batch_size=2)
    prog = build_programs(model, par, train, layout)[0]
    gathers = [
        i for i in prog.instrs if i.kind == Kind.COLLECTIVE and i.name == "tp.all_gather.latent"
    ]
    width = MLA.q_lora_rank + MLA.kv_lora_rank + MLA.qk_rope_head_dim
    assert gathers and all(i.nbytes == 128 * width * 2 for i in gathers)


def test_activation_memory_by_hand() -> None:
    model = mla_model()
    par, train, layout = setup(2, 1, tp=2, seq_len=128, global_batch_size=2)
    dm = make_dims(model, par, train, layout)
    T, Ts, h, a = 128, 64, 256, 4
    width = MLA.q_lora_rank + MLA.kv_lora_rank + MLA.qk_rope_head_dim
    qkv = a * (2 * 48 + 32)
    mlp = 2 * 2 * Ts * h + 2 * T * (2 * 256 + 256)
    # the latents and the fused up-projections' normed copies of them
    latents = 2 * T * width + 2 * T * (MLA.q_lora_rank + MLA.kv_lora_rank)
    selective = 2 * 2 * Ts * h + latents + 2 * T * qkv + mlp
    assert layer_activation_bytes(dm, "selective") == selective
    assert layer_activation_bytes(dm, "none") == selective + 2 * T * a * 32 + 4 * T * a
    assert layer_activation_bytes(dm, "full") == 2 * Ts * h


def test_recompute_modules_and_fp8_activation_memory_by_hand() -> None:
    """Megatron-Core's mla_up_proj frees Q, K and V and the normed latents; mlp keeps
    the MLP's input only; layernorm drops the norm's output; under FP8 a linear keeps
    a one-byte copy of its input (the output projection's of O too)."""
    model = mla_model()
    par, train, layout = setup(2, 1, tp=2, seq_len=128, global_batch_size=2)
    dm = make_dims(model, par, train, layout)
    T, Ts, h, a = 128, 64, 256, 4
    width = MLA.q_lora_rank + MLA.kv_lora_rank + MLA.qk_rope_head_dim
    core = 2 * T * a * 32 + 4 * T * a
    mods = frozenset({"mla_up_proj", "mlp"})
    expect = 2 * 2 * Ts * h + 2 * T * width + core + 2 * Ts * h
    assert layer_activation_bytes(dm, "selective", mods) == expect
    mods = frozenset({"mla_up_proj", "mlp", "layernorm", "core_attn"})
    assert layer_activation_bytes(dm, "selective", mods) == 2 * Ts * h + 2 * T * width + 2 * Ts * h
    # recompute: none ignores the modules
    assert layer_activation_bytes(dm, "none", mods) == layer_activation_bytes(dm, "none")
    fp8 = make_dims(model, par, train.model_copy(update={"precision": "fp8"}), layout)
    qkv = a * (2 * 48 + 32)
    mlp = 3 * Ts * h + 2 * T * 2 * 256 + 1 * T * 256
    attn = 2 * 2 * Ts * h + 2 * T * width + 1 * T * (MLA.q_lora_rank + MLA.kv_lora_rank)
    attn += 2 * T * qkv + core + 1 * T * a * 32
    assert layer_activation_bytes(fp8, "none") == attn + mlp


def test_rank_params_split_up_projections_and_replicate_down() -> None:
    model = mla_model()
    par, _, layout = setup(2, 1, tp=2, seq_len=128, global_batch_size=2)
    one = rank_param_count(model, setup(1, 1, seq_len=128, global_batch_size=2)[2], 0)
    two = rank_param_count(model, layout, 0)
    down = 256 * (96 + 64 + 16) + 96 + 64
    # Replicated: the down-projections, latent norms and RMSNorms; the rest halves.
    replicated = 4 * (down + 2 * 256) + 256
    assert two == (one - replicated) // 2 + replicated
    del par


def test_model_flops_count_mla_widths() -> None:
    model = mla_model()
    seq = 128
    attn = 6.0 * 4 * 8 * (48 + 32) * seq
    assert model_flops_per_token(model, seq) == 6.0 * model_matmul_params(model) + attn
