"""Model FLOPs (PaLM definition) against closed forms."""

from __future__ import annotations

import pytest

from clustersim.catalog.schema import MoESpec
from clustersim.scenario.models import TrainingCfg
from clustersim.workload import model_flops_per_step, model_flops_per_token, model_matmul_params

from .helpers import llama3_8b, tiny


def test_llama3_8b_per_token() -> None:
    model = llama3_8b()
    n = 8_030_261_248 - 128256 * 4096  # everything but the input embedding table
    assert model_matmul_params(model) == n
    assert model_flops_per_token(model, 8192) == 6 * n + 12 * 32 * 32 * 128 * 8192


def test_causal_halves_attention() -> None:
    model = llama3_8b()
    full = model_flops_per_token(model, 8192)
    assert full - model_flops_per_token(model, 8192, causal=True) == 6 * 32 * 4096 * 8192


def test_per_step() -> None:
    model = llama3_8b()
    train = TrainingCfg(seq_len=4096, global_batch_size=1024)
    assert model_flops_per_step(model, train) == model_flops_per_token(model, 4096) * 4096 * 1024


def test_matches_megatron_formula_for_gpt() -> None:
    """Narayanan et al. (2021): 72*B*s*l*h^2 * (1 + s/(6h) + V/(12*l*h)) without recompute.

    Their count has no norm weights, so it matches ours to within those.
    """
    L, h, V, s, B = 24, 2304, 51200, 2048, 512
    model = tiny(
        layers=L, hidden=h, heads=24, kv_heads=24, ffn_hidden=4 * h, vocab=V,
        activation="gelu", norm="layernorm", position="learned", max_seq_len=s,
    )  # fmt: skip
    train = TrainingCfg(seq_len=s, global_batch_size=B)
    megatron = 72.0 * B * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert model_flops_per_step(model, train) == pytest.approx(megatron, rel=1e-3)


def test_tied_head_still_counts_and_moe_counts_active_experts() -> None:
    assert model_matmul_params(tiny(tied_embeddings=True)) == model_matmul_params(tiny())
    moe = MoESpec(experts=8, top_k=2, expert_ffn_hidden=1536)
    dense_equiv = tiny(ffn_hidden=2 * 1536)
    router = 8 * 512 * 8
    assert model_matmul_params(tiny(moe=moe)) == model_matmul_params(dense_equiv) + router
