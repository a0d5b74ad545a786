"""``parallelism.attention: unfused``: the attention core of Megatron-LM before flash attention."""

from __future__ import annotations

from program_helpers import attention_core

from clustersim import catalog
from clustersim.hardware.work import Work


def _core(attention: str, dropout: float = 0.0, phase: str = "fwd") -> dict[str, Work]:
    sets = [f"parallelism.attention={attention}", f"model.attention_dropout={dropout}"]
    return attention_core(sets, phase)


def test_unfused_scores_go_through_hbm_over_the_whole_square() -> None:
    flash, unfused = _core("flash"), _core("unfused")
    for name in ("attn.core.qk", "attn.core.softmax", "attn.core.pv"):
        assert unfused[name].hbm_bytes > flash[name].hbm_bytes
    assert flash["attn.core.qk"].matmul is not None
    assert unfused["attn.core.qk"].matmul is not None
    q, _, s_flash = flash["attn.core.qk"].matmul
    s_full = unfused["attn.core.qk"].matmul[2]
    assert s_full == 2 * s_flash  # the causal half is computed too
    qk = unfused["attn.core.qk"]
    scores = qk.count * q * s_full
    assert qk.hbm_bytes >= 2 * scores  # bf16 scores written
    # softmax: reads the scores and writes the probabilities (bf16)
    assert unfused["attn.core.softmax"].hbm_bytes == 4 * scores
    assert unfused["attn.core.softmax"].scalar_ops == scores


def test_attention_dropout_is_a_pass_over_the_probabilities_and_a_mask() -> None:
    plain, dropped = _core("unfused"), _core("unfused", 0.1)
    q, _, s = plain["attn.core.qk"].matmul or (0, 0, 0)
    scores = plain["attn.core.qk"].count * q * s
    # dropout reads the probabilities, writes them dropped (bf16) and a one-byte mask
    extra = dropped["attn.core.softmax"].hbm_bytes - plain["attn.core.softmax"].hbm_bytes
    assert extra == 5 * scores
    back = _core("unfused", 0.0, "bwd"), _core("unfused", 0.1, "bwd")
    names = set(back[0])
    assert names == set(back[1])
    diff = {n: back[1][n].hbm_bytes - back[0][n].hbm_bytes for n in names}
    assert sum(diff.values()) == scores  # the backward reads the mask once
    # flash attention applies dropout inside its kernel: the same work either way
    flash = _core("flash"), _core("flash", 0.1)
    assert {n: w.hbm_bytes for n, w in flash[0].items()} == {
        n: w.hbm_bytes for n, w in flash[1].items()
    }


def test_catalog_models_train_with_their_sources_attention_dropout() -> None:
    for name in ("gpt3-6.7b", "gpt3-175b", "megatron-1.7b", "megatron-1008b"):
        assert catalog.model(name).attention_dropout == 0.1  # Megatron-LM's and NeMo's GPT
    for name in ("llama2-7b", "llama2-13b", "llama3-8b", "mixtral-8x7b"):
        assert catalog.model(name).attention_dropout == 0.0
