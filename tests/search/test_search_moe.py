"""The layout search on MoE models: ep and etp enumerated, estimates against simulation."""

from __future__ import annotations

from typing import Any

import pytest

from clustersim import catalog
from clustersim.hardware.chip import ChipModel
from clustersim.scenario import Resolved, load_scenario
from clustersim.search import Candidate, Estimator, NetModel, enumerate_layouts
from clustersim.sim import simulate
from clustersim.workload import make_layout

MOE_MODELS = [n for n in catalog.names("models") if catalog.model(n).moe is not None]

TINY_MOE = """\
name: tiny-moe
seed: 3
cluster: {instance: p5.48xlarge, count: 2}
model:
  name: tiny-moe
  layers: 4
  hidden: 2048
  heads: 16
  kv_heads: 16
  ffn_hidden: 2048
  vocab: 8192
  moe: {experts: 16, top_k: 2, expert_ffn_hidden: 1536, shared_experts: 1, dense_layers: 1}
parallelism: {tp: 1, pp: 2, ep: 8, zero: 1}
training: {seq_len: 2048, global_batch_size: 32}
output: {trace: false, html: false}
"""


def _candidates(res: Resolved) -> list[Candidate]:
    """Every layout the search enumerates for ``res``'s chips, with its own settings."""
    return enumerate_layouts(
        res.model,
        res.scenario.parallelism,
        res.scenario.training,
        ranks=res.ranks,
        ranks_per_chip=res.ranks_per_chip,
        hbm_bytes_per_chip=res.chip.hbm_bytes,
    )


def test_moe_models_in_the_catalog() -> None:
    assert set(MOE_MODELS) >= {
        "mixtral-8x7b",
        "mixtral-8x22b",
        "qwen3-30b-a3b",
        "qwen3-235b-a22b",
        "deepseek-v3",
    }


# Chips of Trn2 for each model: enough HBM for its weights and Adam state.
CHIPS = {"qwen3-30b-a3b": 16, "mixtral-8x7b": 64, "mixtral-8x22b": 64, "qwen3-235b-a22b": 128}


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in MOE_MODELS if n in CHIPS])
def test_search_finds_valid_fitting_moe_layouts(name: str) -> None:
    chips = CHIPS[name]
    res = load_scenario(
        TINY_MOE.replace(
            "cluster: {instance: p5.48xlarge, count: 2}",
            f"cluster: {{instance: trn2u.48xlarge, count: {chips // 16}}}",
        ),
        [
            f"model={name}",
            "training.seq_len=4096",
            "training.global_batch_size=256",
            "parallelism.uneven_stages=true",
        ],
    )
    cands = _candidates(res)
    fitting = [c for c in cands if c.fits]
    assert fitting, name
    assert all(c.valid for c in fitting)
    assert any(c.layout.ep > 1 for c in fitting)
    assert {c.layout.etp for c in cands} >= {1}
    for c in fitting[:: max(1, len(fitting) // 5)]:
        make_layout(c.par, res.ranks, res.ranks_per_chip)  # the scenario's own checks agree


MOE_CASES: list[object] = [
    [],
    ["moe.skew=1.0"],
    # single-stage layouts: the data-parallel collectives span both p5 nodes
    ["parallelism.ep=4", "parallelism.pp=1", "moe.capacity_factor=1.25", "moe.skew=0.5"],
    ["parallelism.tp=2", "parallelism.etp=1", "parallelism.ep=8", "parallelism.pp=1"],
    ["parallelism.tp=2", "parallelism.ep=4"],
]


@pytest.mark.parametrize("sets", MOE_CASES, ids=lambda s: ",".join(s) or "base")
def test_estimate_within_3_percent_of_simulation(sets: list[str]) -> None:
    res = load_scenario(TINY_MOE, sets)
    sc = res.scenario
    layout = make_layout(sc.parallelism, res.ranks, res.ranks_per_chip)
    chip = ChipModel(res.chip, res.lnc)
    net = NetModel.of(res.instance, res.chip, sc.cluster.count, res.lnc)
    est = Estimator(res.model, sc.training, chip, net, moe=sc.moe, seed=sc.seed)
    got = est(sc.parallelism, layout)
    sim: dict[str, Any] = simulate(res, record=False, fidelity="detailed").summary
    assert got.step_time_s == pytest.approx(sim["step_time_s"], rel=0.03)
    assert got.compute_s == pytest.approx(sim["breakdown_s"]["compute"], rel=1e-6)


def test_search_enumerates_ep_and_etp_on_a_small_moe_model() -> None:
    res = load_scenario(TINY_MOE, ["training.global_batch_size=16"])
    cands = _candidates(res)
    fitting = [c for c in cands if c.fits]
    assert fitting and all(c.valid for c in fitting)
    assert {c.layout.ep for c in fitting} >= {1, 2, 4, 8, 16}
    assert {c.layout.etp for c in fitting} >= {1, 2}
