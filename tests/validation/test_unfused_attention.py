"""``parallelism.attention: unfused``: the attention core of Megatron-LM before flash attention."""

from __future__ import annotations

from scenario_texts import TINY

from clustersim.hardware.work import Work
from clustersim.scenario import load_scenario
from clustersim.sim import plan


def _core(attention: str) -> dict[str, Work]:
    res = load_scenario(TINY, [f"parallelism.attention={attention}"])
    prog = plan(res).programs[0]
    return {
        i.name: i.work
        for i in prog.instrs
        if i.name.startswith("attn.core") and i.work is not None and i.phase == "fwd"
    }


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
    # softmax and dropout: read and write the scores, read and write the probabilities, a mask
    assert unfused["attn.core.softmax"].hbm_bytes == 9 * scores
    assert unfused["attn.core.softmax"].scalar_ops == scores
