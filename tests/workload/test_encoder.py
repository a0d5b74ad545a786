"""``model.causal: false``: an encoder's bidirectional attention (BERT)."""

from __future__ import annotations

from pathlib import Path

import pytest
from program_helpers import attention_core
from scenario_texts import TINY

from clustersim import catalog
from clustersim.cli import main
from clustersim.errors import ScenarioError
from clustersim.hardware.work import Work
from clustersim.scenario import load_scenario
from clustersim.serve.run import serve
from clustersim.sim import plan


def _core(attention: str, causal: bool, phase: str = "fwd") -> dict[str, Work]:
    sets = [f"parallelism.attention={attention}", f"model.causal={str(causal).lower()}"]
    return attention_core(sets, phase)


@pytest.mark.parametrize("phase", ["fwd", "bwd"])
def test_flash_attention_of_an_encoder_computes_the_whole_square(phase: str) -> None:
    decoder, encoder = _core("flash", True, phase), _core("flash", False, phase)
    assert set(decoder) == set(encoder)
    for name, work in decoder.items():
        if work.matmul is None:
            continue
        other = encoder[name].matmul
        assert other is not None
        m, k, n = work.matmul
        flops, flops_encoder = m * k * n, other[0] * other[1] * other[2]
        assert flops_encoder == 2 * flops  # the causal mask skipped half of the scores
        # the kernel reads Q, K, V and writes O either way
        assert encoder[name].hbm_bytes == work.hbm_bytes


def test_unfused_attention_computes_the_whole_square_either_way() -> None:
    decoder, encoder = _core("unfused", True), _core("unfused", False)
    assert {n: (w.matmul, w.hbm_bytes) for n, w in decoder.items()} == {
        n: (w.matmul, w.hbm_bytes) for n, w in encoder.items()
    }


def test_bert_large_is_an_encoder_from_its_sources() -> None:
    bert = catalog.model("bert-large")
    assert not bert.causal
    assert (bert.layers, bert.hidden, bert.heads, bert.ffn_hidden) == (24, 1024, 16, 4096)
    assert all(catalog.model(n).causal for n in ("llama3-8b", "gpt3-175b", "deepseek-v3"))
    assert "causal" in bert.sources


def test_an_encoder_takes_no_context_parallelism() -> None:
    text = TINY.replace("tp: 4, pp: 2", "tp: 4, pp: 1, cp: 2")
    with pytest.raises(ScenarioError) as info:
        plan(load_scenario(text, ["model.causal=false"]))
    assert info.value.path == "parallelism.cp"


def test_an_encoder_is_not_served() -> None:
    text = (
        "name: s\ncluster: {instance: trn1.32xlarge}\nmodel: bert-large\n"
        "parallelism: {tp: 8}\nserving: {arrival: {kind: poisson, rate_per_s: 1}, requests: 4}\n"
    )
    with pytest.raises(ScenarioError) as info:
        serve(load_scenario(text))
    assert info.value.path == "model"


def test_bert_large_pretraining_runs_from_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "bert.yaml"
    path.write_text(
        "name: bert\ncluster: {instance: trn1.32xlarge, count: 1}\nmodel: bert-large\n"
        "parallelism: {tp: 1, dp: 32, microbatch_size: 16, attention: unfused}\n"
        "training: {seq_len: 128, global_batch_size: 512, steps: 1}\n"
    )
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-report", "--quiet"]) == 0
