"""DualPipe (DualPipeV): the order, the V placement of chunks, and its overlap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clustersim.scenario import load_scenario
from clustersim.scenario.models import ParallelismCfg
from clustersim.sim import simulate
from clustersim.workload import Kind, build_programs, make_layout
from clustersim.workload.dims import chunk_layers, stage_pieces
from clustersim.workload.memory import _held
from clustersim.workload.schedules import dualpipe, dualpipe_units, peak_in_flight

from .helpers import check_refuses, tiny, tiny_moe_scenario

SCENARIO = tiny_moe_scenario("dualpipe", "tp: 1, pp: 4, ep: 2, zero: 1", layers=8)


def _run(*sets: str, fidelity: Any = "detailed") -> dict[str, Any]:
    return simulate(load_scenario(SCENARIO, list(sets)), fidelity=fidelity, record=False).summary


@pytest.mark.parametrize(("pp", "n_mb"), [(2, 4), (4, 8), (4, 11), (8, 16)])
def test_every_chunk_runs_each_microbatch_once_in_order(pp: int, n_mb: int) -> None:
    for stage in range(pp):
        order = dualpipe(stage, pp, n_mb)
        for kind in "FB":
            for chunk in (0, 1):
                mbs = [mb for k, mb, c in order if k == kind and c == chunk]
                assert mbs == list(range(n_mb))
        # a backward follows its own forward
        seen = set()
        for kind, mb, chunk in order:
            if kind == "F":
                seen.add((mb, chunk))
            else:
                assert (mb, chunk) in seen
        units = dualpipe_units(stage, pp, n_mb)
        assert sorted(i for u in units for i in u) == list(range(len(order)))
        for unit in units:
            if len(unit) == 2:
                (k0, mb0, c0), (k1, mb1, c1) = (order[i] for i in unit)
                assert mb0 != mb1
                assert (k0, k1) == ("F", "B") and c0 != c1


def test_chunks_sit_in_a_v_with_embedding_and_head_on_the_first_stage() -> None:
    model = tiny()
    layout = make_layout(ParallelismCfg(pp=4, schedule="dualpipe"), 4, 1)
    assert layout.vp == 2 and layout.vshape
    assert [layout.global_chunk(s, k) for s in range(4) for k in (0, 1)] == [
        0, 7, 1, 6, 2, 5, 3, 4,
    ]  # fmt: skip
    assert list(chunk_layers(model, layout, 0, 1)) == [7]
    every = sorted(i for s in range(4) for k in (0, 1) for i in chunk_layers(model, layout, s, k))
    assert every == list(range(model.layers))
    names = {name for layer, name, _ in stage_pieces(model, layout, 0) if layer == -1}
    assert {"embed", "lm_head"} <= names
    assert not any(layer == -1 for layer, _, _ in stage_pieces(model, layout, 3))


def test_the_bottom_stage_hands_its_chunks_over_without_a_message() -> None:
    res = load_scenario(SCENARIO, ["parallelism.schedule=dualpipe"])
    sc = res.scenario
    layout = make_layout(sc.parallelism, res.ranks, res.ranks_per_chip, res.ranks_per_node)
    progs = build_programs(res.model, sc.parallelism, sc.training, layout, moe=sc.moe)
    n_mb = 32 // layout.dp
    bottom = [i for i in progs[3].instrs if i.kind in (Kind.SEND, Kind.RECV)]
    # one message per microbatch each way and each pass, to stage 2 only
    assert {i.peer for i in bottom} == {-1}
    assert len(bottom) == 4 * n_mb
    top = [i for i in progs[0].instrs if i.kind in (Kind.SEND, Kind.RECV)]
    assert {i.peer for i in top} == {1} and len(top) == 4 * n_mb


def test_memory_walks_the_order() -> None:
    layout = make_layout(ParallelismCfg(pp=4, schedule="dualpipe"), 4, 1)
    for stage in range(4):
        held = _held("dualpipe", stage, layout, 8, [3, 5], overlap=True)
        assert held == peak_in_flight(dualpipe(stage, 4, 8), [3, 5])


def test_dualpipe_shrinks_bubble_and_exposed_all_to_all_and_folds() -> None:
    plain = _run()
    dual = _run("parallelism.schedule=dualpipe")
    inter = _run("parallelism.virtual_stages=2")
    assert dual["step_time_s"] < inter["step_time_s"] < plain["step_time_s"]
    assert dual["breakdown_s"]["bubble"] < plain["breakdown_s"]["bubble"]
    assert dual["breakdown_s"]["exposed_comm"] < inter["breakdown_s"]["exposed_comm"]
    assert dual["breakdown_s"]["compute"] == pytest.approx(plain["breakdown_s"]["compute"])
    folded = _run("parallelism.schedule=dualpipe", fidelity="folded")
    assert folded["step_time_s"] == pytest.approx(dual["step_time_s"], rel=0.01)


@pytest.mark.parametrize(
    ("sets", "key"),
    [
        (["parallelism.schedule=dualpipe", "training.global_batch_size=8"], "parallelism.schedule"),
        (["parallelism.schedule=dualpipe", "parallelism.virtual_stages=3"], "virtual_stages"),
        (["parallelism.schedule=zigzag"], "parallelism.schedule"),
    ],
)
def test_bad_input_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sets: list[str], key: str
) -> None:
    check_refuses(tmp_path, capsys, SCENARIO, sets, key)
