"""Overlap of one microbatch's expert all-to-alls with another's compute."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from clustersim.scenario import load_scenario
from clustersim.sim import simulate
from clustersim.workload import Kind, Layout, build_programs
from clustersim.workload.memory import _held
from clustersim.workload.overlap import interleave, pair_units
from clustersim.workload.program import Instr, Phase
from clustersim.workload.schedules import peak_in_flight, shift_for_overlap, stage_order

from .helpers import tiny_moe_scenario

SCENARIO = tiny_moe_scenario("moe-overlap", "tp: 1, pp: 2, ep: 4, zero: 1")


def _run(*sets: str, fidelity: Any = "detailed") -> dict[str, Any]:
    res = load_scenario(SCENARIO, list(sets))
    return simulate(res, fidelity=fidelity, record=False).summary


def _a2a(group: str = "ep", name: str = "x") -> Instr:
    return Instr(Kind.COLLECTIVE, name, Phase.FORWARD, collective="all_to_all", group=group)


def _op(name: str) -> Instr:
    return Instr(Kind.COMPUTE, name, Phase.FORWARD)


def test_interleave_alternates_segments_with_one_all_to_all_of_each_in_flight() -> None:
    first = [_op("a0"), _a2a(name="A1"), _op("a1"), _a2a(name="A2"), _op("a2")]
    second = [_op("b0"), _a2a(name="B1"), _op("b1")]
    out = interleave(first, second)
    text = [
        (i.name, i.tag) if i.kind == Kind.WAIT_ASYNC else i.name
        for i in out
        if i.kind != Kind.ASYNC_COLLECTIVE
    ]
    # a0, A1 started; b0, B1 started; wait for A1 (leave B1); a1, A2 started;
    # wait for B1 (leave A2); b1; wait for A2; a2
    assert text == ["a0", "b0", ("A1.wait", 1), "a1", ("B1.wait", 1), "b1", ("A2.wait", 0), "a2"]
    started = [i.name for i in out if i.kind == Kind.ASYNC_COLLECTIVE]
    assert started == ["A1", "B1", "A2"]


def _beside(name: str) -> list[Instr]:
    """The hierarchical dispatcher's exchange: NVLink started, InfiniBand, NVLink waited."""
    return [
        Instr(
            Kind.ASYNC_COLLECTIVE,
            f"n{name}",
            Phase.FORWARD,
            collective="all_to_all",
            group="ep_node",
        ),
        _a2a(group="ep_cross", name=f"x{name}"),
        Instr(
            Kind.WAIT_ASYNC,
            f"n{name}.wait",
            Phase.FORWARD,
            collective="all_to_all",
            group="ep_node",
        ),
    ]


def test_interleave_takes_a_hierarchical_exchange_as_one_cut() -> None:
    first = [_op("a0"), *_beside("A1"), _op("a1")]
    second = [_op("b0"), *_beside("B1"), _op("b1")]
    out = interleave(first, second)
    text = [(i.name, i.tag) if i.kind == Kind.WAIT_ASYNC else i.name for i in out]
    # both parts of each exchange start together and hide behind the other's segment;
    # each wait leaves the other list's exchange of its group in flight
    assert text == [
        "a0", "nA1", "xA1", "b0", "nB1", "xB1",
        ("nA1.wait", 1), ("xA1.wait", 1), "a1",
        ("nB1.wait", 0), ("xB1.wait", 0), "b1",
    ]  # fmt: skip


def test_interleave_leaves_lists_without_expert_all_to_alls_alone() -> None:
    first = [_op("a0"), _a2a(group="tp")]
    second = [_op("b0")]
    assert interleave(first, second) == first + second


def test_pairs_are_a_forward_and_a_backward_of_different_microbatches() -> None:
    order = stage_order("1f1b", 1, 2, 4, 1, overlap=True)
    assert order == [("F", 0, 0), ("F", 1, 0), ("B", 0, 0), ("F", 2, 0), ("B", 1, 0),
                     ("F", 3, 0), ("B", 2, 0), ("B", 3, 0)]  # fmt: skip
    units = pair_units(order)
    assert units == [(0,), (1, 2), (3, 4), (5, 6), (7,)]
    for unit in units:
        if len(unit) == 2:
            (k0, mb0, _), (k1, mb1, _) = (order[j] for j in unit)
            assert k0 != k1 and mb0 != mb1


@pytest.mark.parametrize(("pp", "vp", "n_mb"), [(1, 1, 4), (4, 1, 8), (4, 1, 3), (4, 2, 8)])
def test_deeper_warm_up_keeps_each_kind_in_order(pp: int, vp: int, n_mb: int) -> None:
    for stage in range(pp):
        plain = stage_order("1f1b", stage, pp, n_mb, vp, overlap=False)
        shifted = stage_order("1f1b", stage, pp, n_mb, vp, overlap=True)
        for kind in "FB":
            assert [s for s in shifted if s[0] == kind] == [s for s in plain if s[0] == kind]
        assert shifted == shift_for_overlap(plain, pp - stage if vp == 1 else 1)
        if vp == 1:  # the memory model's closed form: twice 1F1B's microbatches
            layout = Layout(tp=1, pp=pp, dp=1, cp=1, ep=1, ranks=pp, ranks_per_chip=1)
            held = _held("1f1b", stage, layout, n_mb, [7], overlap=True)
            assert held == peak_in_flight(shifted, [7]) == 7 * min(2 * (pp - stage), n_mb)


def _key(ins: Instr) -> tuple[Any, ...]:
    kind = Kind.COLLECTIVE if ins.kind == Kind.ASYNC_COLLECTIVE and ins.group == "ep" else ins.kind
    return (kind, ins.name, ins.layer, ins.microbatch, ins.nbytes, ins.work)


def test_overlap_keeps_every_instruction_and_only_adds_waits() -> None:
    """Conservation: the same compute, the same all-to-all bytes, per stage."""
    for vp in (1, 2):
        sets = [f"parallelism.virtual_stages={vp}"]
        res = load_scenario(SCENARIO, sets)
        base = build_programs(*_build_args(res))
        res_o = load_scenario(SCENARIO, [*sets, "parallelism.overlap_moe_a2a=true"])
        over = build_programs(*_build_args(res_o))
        for p, q in zip(base, over, strict=True):
            waits = [i for i in q.instrs if i.kind == Kind.WAIT_ASYNC and i.group == "ep"]
            assert waits
            kept = [i for i in q.instrs if not (i.kind == Kind.WAIT_ASYNC and i.group == "ep")]
            assert Counter(map(_key, kept)) == Counter(map(_key, p.instrs))


def _build_args(res: Any) -> tuple[Any, ...]:
    from clustersim.workload import make_layout

    sc = res.scenario
    layout = make_layout(sc.parallelism, 8, 1)
    return res.model, sc.parallelism, sc.training, layout


@pytest.mark.parametrize("vp", [1, 2])
def test_overlap_hides_all_to_all_and_folding_stays_exact(vp: int) -> None:
    sets = [f"parallelism.virtual_stages={vp}"]
    plain = _run(*sets)
    over = _run(*sets, "parallelism.overlap_moe_a2a=true")
    assert over["step_time_s"] < plain["step_time_s"]
    assert over["breakdown_s"]["exposed_comm"] < plain["breakdown_s"]["exposed_comm"]
    folded = _run(*sets, "parallelism.overlap_moe_a2a=true", fidelity="folded")
    assert folded["step_time_s"] == pytest.approx(over["step_time_s"], rel=0.01)
