"""``training.param_dtype: fp32`` (torch.autocast): FP32 parameters and gradients move
4 B an element in the data-parallel reduction and ZeRO-1's all-gather, and take 4 B
in HBM; the estimate follows the simulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.errors import ScenarioError
from clustersim.scenario import load_scenario
from clustersim.search.estimate import estimate_resolved
from clustersim.sim import simulate
from clustersim.workload import Kind, build_programs, grad_buckets, make_layout, validate
from clustersim.workload.dims import stage_pieces
from clustersim.workload.memory import memory_per_rank

from .helpers import setup, tiny

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
WHOLE = float(1 << 62)  # one bucket per chunk


def _fp32(train: object) -> object:
    return train.model_copy(update={"param_dtype": "fp32"})  # type: ignore[attr-defined]


def test_fp32_buckets_hold_four_bytes_a_parameter() -> None:
    model = tiny()
    _, _, lay = setup(8, zero=1)
    params = sum(n for _, _, n in stage_pieces(model, lay, 0))
    assert grad_buckets(model, lay, 0, WHOLE)[1] == [2 * params]
    assert grad_buckets(model, lay, 0, WHOLE, elem_bytes=4)[1] == [4 * params]
    # a bucket closes at half the parameters: the cut of the bf16 buckets at twice the size
    half = [2 * b for b in grad_buckets(model, lay, 0, 2 * 2**20)[1]]
    assert grad_buckets(model, lay, 0, 4 * 2**20, elem_bytes=4)[1] == half


def test_zero1_reduce_scatters_and_gathers_fp32() -> None:
    model = tiny()
    par, train, lay = setup(8, zero=1)
    params = sum(n for _, _, n in stage_pieces(model, lay, 0))
    for t, each in ((train, 2), (_fp32(train), 4)):
        prog = build_programs(model, par, t, lay)[0]  # type: ignore[arg-type]
        rs = sum(i.nbytes for i in prog.instrs if i.kind == Kind.ASYNC_COLLECTIVE)
        ag = sum(i.nbytes for i in prog.instrs if i.collective == "all_gather" and i.group == "dp")
        assert rs == ag == each * params


def test_fp32_weights_and_grads_in_hbm() -> None:
    model = tiny()
    par, train, lay = setup(8, zero=1)
    bf16 = memory_per_rank(model, par, train, lay, 0)
    fp32 = memory_per_rank(model, par, _fp32(train), lay, 0)  # type: ignore[arg-type]
    assert fp32.weights == 2 * bf16.weights
    assert fp32.grads == 2 * bf16.grads
    assert fp32.optimizer == bf16.optimizer  # Adam's FP32 shard either way
    assert fp32.activations == bf16.activations


def test_fp32_parameters_refused_when_sharded() -> None:
    model = tiny()
    par, train, lay = setup(8, zero=2)
    with pytest.raises(ScenarioError) as err:
        validate(model, par, _fp32(train), lay)  # type: ignore[arg-type]
    assert "training.param_dtype" in str(err.value)


def test_fp32_estimate_agrees_with_the_simulator() -> None:
    sets = ["parallelism.zero=1", "training.global_batch_size=16", "training.param_dtype=fp32"]
    res = load_scenario(SCENARIOS / "trn2-llama3-8b.yaml", sets)
    sc = res.scenario
    validate(
        res.model,
        sc.parallelism,
        sc.training,
        make_layout(sc.parallelism, res.ranks, res.ranks_per_chip),
    )
    est = estimate_resolved(res)
    sim = simulate(res, record=False, fidelity="detailed").summary
    assert est.step_time_s == pytest.approx(sim["step_time_s"], rel=0.03)
    bf16 = load_scenario(SCENARIOS / "trn2-llama3-8b.yaml", sets[:2])
    assert estimate_resolved(bf16).step_time_s < est.step_time_s
