"""The layout search's estimate against the simulator on every shipped scenario.

The estimate runs the simulator's op templates on the same roofline (same attention
kernel, precision, recompute and schedule), so compute agrees to rounding; the
3% covers its closed-form network and pipeline.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.scenario import load_scenario
from clustersim.search.estimate import estimate_resolved
from clustersim.sim import simulate

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
FAST = [
    "trn2-llama3-8b.yaml",
    "p5-llama3-8b.yaml",
    "trn1-llama2-7b.yaml",
    "mbridge-llama3-8b-fsdp.yaml",
    "trn2-ultraserver-lane-loss.yaml",
    "trn1-bert-large.yaml",  # host-bound: the estimate's host floor against the simulator's
]
SLOW = [
    "trn2-ultraserver-llama3-70b.yaml",
    "trn2-multi-ultraserver-llama3-70b.yaml",
    "trn3-ultraserver-llama3-405b.yaml",
    "llama3-16k-54days.yaml",
    "checkpoint-interval-study.yaml",
    "trn2-ultraserver-llama3-70b-fsdp.yaml",
    "trn2-ultraserver-custom-fabric.yaml",
    "p5-qwen3-30b-a3b.yaml",
    "trn2-ultracluster-deepseek-v3.yaml",
    "trn2-ultraserver-mixtral-8x7b.yaml",
    "dgx-h100-llama3-70b-sharp.yaml",
]


# Serving scenarios run with `clustersim serve`: no training step to estimate.
SERVING = sorted(p.name for p in SCENARIOS.glob("serve-*.yaml"))


def test_every_shipped_scenario_is_listed() -> None:
    assert {p.name for p in SCENARIOS.glob("*.yaml")} == {*FAST, *SLOW, *SERVING}


def _ratio(name: str) -> float:
    res = load_scenario(SCENARIOS / name, ["failures={}", "training.steps=1"])
    est = estimate_resolved(res)
    sim = simulate(res, record=False).summary
    assert est.compute_s == pytest.approx(sim["breakdown_s"]["compute"], rel=1e-6)
    return est.step_time_s / float(sim["step_time_s"])


@pytest.mark.parametrize("name", FAST)
def test_estimate_within_3_percent(name: str) -> None:
    assert _ratio(name) == pytest.approx(1.0, abs=0.03)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_estimate_within_3_percent_large(name: str) -> None:
    assert _ratio(name) == pytest.approx(1.0, abs=0.03)


def test_estimate_follows_the_cp_ring() -> None:
    """Transformer Engine's CP ring (``cp_comm_type: p2p``): the estimate runs the same
    per-step kernels and merges, and counts the ring's transfers where they outlast the
    steps they overlap, as the simulator runs them (NeMo's Llama3-8B, CP 2 on 8 H100)."""
    from clustersim.validation.rows import references
    from clustersim.validation.training import scenario_text

    ref = next(r for r in references().training if r.name == "nemo-llama3-8b")
    sets = ["parallelism.cp_comm_type=p2p", "training.global_batch_size=32"]
    res = load_scenario(scenario_text(ref), sets)
    est = estimate_resolved(res)
    sim = simulate(res, record=False).summary
    assert est.compute_s == pytest.approx(sim["breakdown_s"]["compute"], rel=1e-6)
    assert est.step_time_s / float(sim["step_time_s"]) == pytest.approx(1.0, abs=0.03)


@pytest.mark.parametrize(
    "rule",
    ["grad_bucketing=first_chunk", "grad_bucketing=every_chunk", "overlap_grad_reduce=false"],
)
def test_estimate_follows_the_gradient_bucketing(rule: str) -> None:
    # 32 H100s, TP 2 x PP 2 x VP 2 x DP 4: the DP group crosses the nodes
    sets = ["parallelism.pp=2", "parallelism.tp=2", "parallelism.virtual_stages=2"]
    sets += ["training.global_batch_size=64", "cluster.count=4", f"parallelism.{rule}"]
    res = load_scenario(SCENARIOS / "p5-llama3-8b.yaml", ["failures={}", *sets])
    est = estimate_resolved(res).step_time_s
    assert est / float(simulate(res, record=False).summary["step_time_s"]) == pytest.approx(
        1.0, abs=0.03
    )
