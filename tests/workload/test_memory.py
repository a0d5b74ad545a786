"""Parameter counts and memory per rank, checked against hand counts."""

from __future__ import annotations

import pytest

from clustersim.catalog.schema import MoESpec
from clustersim.errors import ScenarioError
from clustersim.workload import (
    Layout,
    check_fits,
    layer_activation_bytes,
    make_dims,
    memory_per_rank,
    non_embedding_param_count,
    padded_vocab,
    param_count,
    peak_memory,
    rank_param_count,
    stage_param_count,
)

from .helpers import llama3_8b, llama3_70b, setup, tiny

GIB = 2**30


def test_llama3_param_counts() -> None:
    assert param_count(llama3_8b()) == 8_030_261_248
    assert param_count(llama3_70b()) == pytest.approx(70.55e9, rel=1e-3)
    assert non_embedding_param_count(llama3_8b()) == 8_030_261_248 - 128256 * 4096


def test_param_count_variants() -> None:
    base = tiny()
    tied = tiny(tied_embeddings=True)
    assert param_count(base) - param_count(tied) == 4096 * 512
    learned = tiny(position="learned", norm="layernorm")
    # Learned positions add a table; LayerNorm adds a bias per norm (2 per layer + final).
    assert param_count(learned) - param_count(base) == 1024 * 512 + (2 * 8 + 1) * 512
    assert non_embedding_param_count(learned) == param_count(learned) - 4096 * 512 - 1024 * 512


def test_moe_param_count() -> None:
    moe = MoESpec(experts=8, top_k=2, expert_ffn_hidden=1024, shared_experts=1, dense_layers=2)
    model = tiny(moe=moe)
    attn_norms = 512 * (8 + 8) * 64 + 512 * 512 + 2 * 512
    dense = attn_norms + 3 * 512 * 1536
    sparse = attn_norms + 512 * 8 + (8 + 1) * 3 * 512 * 1024
    active = attn_norms + 512 * 8 + (2 + 1) * 3 * 512 * 1024
    embed_head_final = 2 * 4096 * 512 + 512
    assert param_count(model) == 2 * dense + 6 * sparse + embed_head_final
    assert (
        non_embedding_param_count(model, active=True) == 2 * dense + 6 * active + 4096 * 512 + 512
    )


def test_stage_params_sum_to_total() -> None:
    model = llama3_8b()
    for pp in (1, 2, 4):
        lay = Layout(tp=1, pp=pp, dp=1, cp=1, ep=1, ranks=pp, ranks_per_chip=1)
        assert sum(stage_param_count(model, lay, k) for k in range(pp)) == param_count(model)
        # Without padding or replication, the TP=1 shard is the whole stage.
        assert all(
            rank_param_count(model, lay, k) == stage_param_count(model, lay, k) for k in range(pp)
        )


def test_padded_vocab() -> None:
    assert padded_vocab(128256, 1) == 128256
    assert padded_vocab(128256, 8) == 129024
    assert padded_vocab(50257, 1) == 50304


# llama3-8b on 64 ranks: tp=8, dp=8, pp=1, zero=0, microbatch 1, seq 8192, 8 microbatches.
H, T, TP = 4096, 8192, 8
LAYER_SHARD = (
    4096 * (32 // 8 + 2 * (8 // 8)) * 128  # QKV: 4 query heads + 1 K + 1 V head per rank
    + (32 // 8) * 128 * 4096  # output projection
    + 3 * 4096 * (14336 // 8)  # gate, up, down
    + 2 * 4096  # two RMSNorm weights, replicated
)
VOCAB_SHARD = 129024 // 8  # 128256 padded to a multiple of 128*8
RANK_PARAMS = 32 * LAYER_SHARD + 2 * VOCAB_SHARD * 4096 + 4096  # + embedding, LM head, final norm
ACT_LAYER_NONE = (
    4 * 2 * (T // TP) * H  # attention and MLP norm inputs, QKV and MLP-up inputs (SP shards)
    + 2 * T * (4 + 2 * 1) * 128  # Q, K, V
    + 2 * T * 4 * 128  # attention output O
    + 4 * T * 4  # FP32 log-sum-exp per local head
    + 2 * T * 3 * (14336 // 8)  # SwiGLU: gate and up, and the down projection's input
)
ACT_HEAD = 2 * 2 * (T // TP) * H + 4 * T * VOCAB_SHARD  # final norm and LM head inputs; softmax


def test_memory_hand_count_llama3_8b() -> None:
    assert RANK_PARAMS == 1_004_802_048
    assert ACT_LAYER_NONE == 142_737_408
    model = llama3_8b()
    par, train, lay = setup(64, tp=8, zero=0, recompute="none", seq_len=8192, global_batch_size=64)
    assert lay.dp == 8
    assert rank_param_count(model, lay, 0) == RANK_PARAMS
    mem = memory_per_rank(model, par, train, lay, 0)
    assert mem.weights == 2 * RANK_PARAMS
    assert mem.grads == 2 * RANK_PARAMS  # bf16 gradients
    assert mem.optimizer == 12 * RANK_PARAMS  # FP32 master, Adam m and v
    # pp = 1: 1F1B keeps one microbatch in flight.
    assert mem.activations == 32 * ACT_LAYER_NONE + ACT_HEAD == 5_112_856_576
    assert mem.total == pytest.approx(21.2e9, rel=1e-2)
    assert peak_memory(model, par, train, lay) == mem

    # ZeRO-1 shards the optimizer over dp = 8, and nothing else.
    par1, _, _ = setup(64, tp=8, zero=1, recompute="none")
    mem1 = memory_per_rank(model, par1, train, lay, 0)
    assert mem1.optimizer == 12 * -(-RANK_PARAMS // 8)
    assert (mem1.weights, mem1.grads, mem1.activations) == (
        mem.weights,
        mem.grads,
        mem.activations,
    )

    # Selective: no O nor log-sum-exp, except for the layer in backward.
    core = 2 * T * 4 * 128 + 4 * T * 4
    sel = memory_per_rank(model, par.model_copy(update={"recompute": "selective"}), train, lay, 0)
    assert sel.activations == 32 * (ACT_LAYER_NONE - core) + ACT_HEAD + core
    # Full: each layer keeps its input shard; the layer in backward holds everything.
    full = memory_per_rank(model, par.model_copy(update={"recompute": "full"}), train, lay, 0)
    layer_in = 2 * (T // TP) * H
    assert full.activations == 32 * layer_in + ACT_HEAD + (ACT_LAYER_NONE - layer_in)


def test_activations_match_korthikanti_for_gpt() -> None:
    """GPT (a = g, GeLU, f = 4h, no dropout, flash attention): 32*s*b*h/t bytes per layer.

    Korthikanti et al. give sbh(34 + 5as/h)/t with sequence parallelism; flash
    attention drops the 5as/h scores term and no dropout drops two masks (2sbh),
    while we add the FP32 log-sum-exp (4 B per token and local head).
    """
    model = tiny(kv_heads=8, ffn_hidden=4 * 512, activation="gelu", norm="layernorm")
    par, train, lay = setup(8, tp=4, microbatch_size=2, recompute="none")
    dm = make_dims(model, par, train, lay)
    s, b, h, a, t = 256, 2, 512, 8, 4
    assert layer_activation_bytes(dm, "none") == 32 * s * b * h // t + 4 * s * b * a // t
    assert layer_activation_bytes(dm, "full") == 2 * s * b * h // t


def test_in_flight_microbatches() -> None:
    model = tiny()
    for schedule, held in (("1f1b", [4, 3, 2, 1]), ("gpipe", [8] * 4)):
        par, train, lay = setup(4, pp=4, global_batch_size=8, schedule=schedule, recompute="full")
        dm = make_dims(model, par, train, lay)
        per_layer = layer_activation_bytes(dm, "full")
        transient = layer_activation_bytes(dm, "none") - per_layer
        head = 2 * 2 * 256 * 512 + 4 * 256 * 4096
        for stage in range(4):
            mem = memory_per_rank(model, par, train, lay, stage)
            extra = head if stage == 3 else 0
            assert mem.activations == held[stage] * (2 * per_layer + extra) + transient


def test_in_flight_model_chunks_when_interleaved() -> None:
    """Two chunks of one layer per stage: Megatron's warm-up plus one chunk in flight."""
    model = tiny()
    par, train, lay = setup(4, pp=4, global_batch_size=8, virtual_stages=2, recompute="full")
    dm = make_dims(model, par, train, lay)
    per_layer = layer_activation_bytes(dm, "full")
    transient = layer_activation_bytes(dm, "none") - per_layer
    head = 2 * 2 * 256 * 512 + 4 * 256 * 4096
    # 2 (pp - stage - 1) + (v - 1) pp warm-up forwards; the last stage's fifth is its
    # second chunk, which also holds the head's activations.
    held = [11 * per_layer, 9 * per_layer, 7 * per_layer, 5 * per_layer + head]
    for stage in range(4):
        mem = memory_per_rank(model, par, train, lay, stage)
        assert mem.activations == held[stage] + transient
    plain = setup(4, pp=4, global_batch_size=8, recompute="full")
    assert sum(memory_per_rank(model, par, train, lay, st).weights for st in range(4)) == sum(
        memory_per_rank(model, *plain, st).weights for st in range(4)
    )


def test_check_fits_passes_and_suggests() -> None:
    model = llama3_8b()
    par, train, lay = setup(64, tp=8, zero=0, recompute="none", seq_len=8192, global_batch_size=64)
    check_fits(model, par, train, lay, 24 * GIB)  # trn2: 96 GiB over 4 ranks
    with pytest.raises(ScenarioError) as err:
        check_fits(model, par, train, lay, 16 * GIB)
    assert err.value.path == "parallelism"
    text = str(err.value)
    assert "GiB per chip but the chip has 64.0 GiB of HBM (over by" in text
    assert "fits with zero: 1" in text


def test_check_fits_combined_and_hopeless() -> None:
    model = llama3_70b()
    par, train, lay = setup(256, tp=8, pp=4, recompute="none", seq_len=8192, global_batch_size=64)
    with pytest.raises(ScenarioError, match="no single change fits; try together: zero: 1"):
        check_fits(model, par, train, lay, 24 * GIB)
    with pytest.raises(ScenarioError, match="use more chips or chips with more HBM"):
        check_fits(model, par, train, lay, 0.5 * GIB)


def test_check_fits_uses_the_fullest_chip() -> None:
    # 3 ranks per chip and stages of 4 ranks: chips straddle stage boundaries.
    model = tiny()
    par, train, lay = setup(12, 3, pp=3, tp=2, global_batch_size=16)
    per_rank = [memory_per_rank(model, par, train, lay, lay.stage(r)).total for r in range(12)]
    fullest = max(sum(per_rank[c * 3 : c * 3 + 3]) for c in range(4))
    check_fits(model, par, train, lay, fullest / 3)
    with pytest.raises(ScenarioError):
        check_fits(model, par, train, lay, fullest / 3 * (1 - 1e-9))
