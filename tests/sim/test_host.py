"""A host that issues the program ahead of the device (``software.host_op_s``)."""

from __future__ import annotations

import pytest

from clustersim.calibration import host
from clustersim.catalog import stacks
from clustersim.scenario import load_scenario
from clustersim.sim import plan, simulate

# One rank, no collectives on the critical path: the step is its ops back to back.
ONE = """\
name: one
cluster: {instance: trn1.32xlarge, count: 1}
model: {name: m, layers: 2, hidden: 1024, heads: 8, kv_heads: 8, ffn_hidden: 4096, vocab: 1024}
parallelism: {tp: 1, pp: 1, dp: 32, zero: 0, recompute: none, microbatch_size: 1}
training: {seq_len: 512, global_batch_size: 128, steps: 1}
"""


def _step(h: float | None) -> dict[str, float]:
    sets = [] if h is None else [f"software.host_op_s={h!r}"]
    s = simulate(load_scenario(ONE, sets), record=False).summary
    return {"step": s["step_time_s"], "host": s["breakdown_s"]["host"]}


def test_a_host_slower_than_the_device_sets_the_step_by_its_ops() -> None:
    program = plan(load_scenario(ONE)).programs[0]
    n = len(program.instrs)
    device = _step(None)["step"]
    h = 10 * device / n  # ten times an op's mean time on the device
    slow, slower = _step(h), _step(2 * h)
    # the last instruction is issued at n h; what follows it (the last gradient bucket's
    # all-reduce, the optimizer) is less than the device's step
    assert n * h <= slow["step"] <= n * h + device / 2
    # host-bound, each op more of the host's time is that much more of the step
    assert slower["step"] - slow["step"] == pytest.approx(n * h, rel=1e-3)
    assert slow["host"] == pytest.approx(slow["step"] - device, rel=0.05)
    assert _step(None)["host"] == 0.0


def test_a_host_faster_than_the_device_costs_at_most_its_first_op() -> None:
    program = plan(load_scenario(ONE)).programs[0]
    device = _step(None)["step"]
    h = device / len(program.instrs) / 100
    assert _step(0.0)["step"] == device  # 0: the engine never waits
    assert device < _step(h)["step"] <= device + h * 1.001


def test_the_stack_sets_host_op_s_and_the_scenario_key_wins() -> None:
    fit = stacks.stack_fit("trn1", "hf-torch-neuronx")
    assert fit.host_op_s > 0
    assert stacks.stack_fit("trn1", "nxd-training").host_op_s == 0.0
    text = ONE + "software: {stack: hf-torch-neuronx}\n"
    assert load_scenario(text).scenario.software.host_op_s == fit.host_op_s
    assert load_scenario(text, ["software.host_op_s=0"]).scenario.software.host_op_s == 0.0
    assert load_scenario(ONE).scenario.software.host_op_s is None  # nxd-training: none


def test_shipped_host_costs_are_the_fits_of_their_rows_inside_their_range() -> None:
    assert host.host_stacks() == ["hf-torch-neuronx"]
    for stack in host.host_stacks():
        assert [r.role for r in host.host_rows(stack)] == ["calibration"] * 2
        fit = host.fit_host(stack)
        shipped = stacks.host_op_s(stack)
        assert fit.host_op_s == pytest.approx(shipped, rel=1e-3)
        assert not fit.at_bound
        assert fit.rms < 0.1
