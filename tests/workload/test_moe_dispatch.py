"""The hierarchical dispatcher and node-limited routing of MoE all-to-alls."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from clustersim.scenario import load_scenario
from clustersim.scenario.models import ParallelismCfg
from clustersim.sim import simulate
from clustersim.sim.folding import replica_groups, representatives
from clustersim.workload import Kind, build_programs, make_layout
from clustersim.workload.moe import nodes_per_token

from .helpers import check_refuses, tiny_moe_scenario

SCENARIO = tiny_moe_scenario(
    "moe-dispatch",
    "tp: 1, pp: 1, ep: 16, zero: 1",
    count=2,
    moe="experts: 16, top_k: 4, expert_ffn_hidden: 1024",
)


def _run(*sets: str, fidelity: Any = "detailed") -> float:
    res = load_scenario(SCENARIO, list(sets))
    return float(simulate(res, fidelity=fidelity, record=False).summary["step_time_s"])


def test_nodes_per_token_closed_forms() -> None:
    assert nodes_per_token(8, 8, 4) == pytest.approx(4 * (1 - 0.75**8))  # DeepSeek-V3: 3.6
    assert nodes_per_token(8, 8) == pytest.approx(8 * (1 - (7 / 8) ** 8))  # 5.25
    assert nodes_per_token(8, 8, 16) == nodes_per_token(8, 8)  # a limit above the nodes
    assert nodes_per_token(1, 8) == pytest.approx(1.0)
    assert nodes_per_token(8, 8, 1) == pytest.approx(1.0)


def test_expert_groups_split_at_nodes_and_fold_like_the_layout() -> None:
    layout = make_layout(ParallelismCfg(tp=2, pp=2, ep=8, etp=1), 32, 1, 4)
    assert (layout.ep_local, layout.ep_nodes) == (4, 2)
    assert layout.group("ep", 16) == tuple(range(16, 24))
    assert layout.group("ep_node", 17) == (16, 17, 18, 19)
    assert layout.group("ep_cross", 17) == (17, 21)
    for name in ("ep_node", "ep_cross"):
        for stage in range(layout.pp):
            rows = replica_groups(layout, name, stage)
            expected = sorted(g for g in layout.groups(name) if layout.stage(g[0]) == stage)
            assert sorted(tuple(int(r) for r in row) for row in rows) == expected
            assert tuple(rows[0]) == layout.group(name, representatives(layout)[stage])
    inside = make_layout(ParallelismCfg(tp=1, pp=1, ep=4), 8, 1, 8)
    assert (inside.ep_local, inside.ep_nodes) == (4, 1)


def _exchanges(sets: list[str]) -> list[Any]:
    res = load_scenario(SCENARIO, sets)
    sc = res.scenario
    layout = make_layout(sc.parallelism, res.ranks, res.ranks_per_chip, res.ranks_per_node)
    prog = build_programs(res.model, sc.parallelism, sc.training, layout, moe=sc.moe)[0]
    started = (Kind.COLLECTIVE, Kind.ASYNC_COLLECTIVE)
    return [i for i in prog.instrs if i.kind in started and i.collective == "all_to_all"]


def test_hierarchical_bytes_closed_form_and_conservation() -> None:
    """Each token crosses nodes once per destination node (D of them), then every
    expert copy moves inside the node: T D h 2 B and T k h 2 B per rank."""
    tokens, k, h = 2048, 4, 1024
    d = nodes_per_token(k, 2)
    flat = _exchanges([])
    assert {i.group for i in flat} == {"ep"}
    assert {i.nbytes for i in flat} == {tokens * k * h * 2}
    hier = _exchanges(["moe.dispatcher=hierarchical"])
    inter = [i for i in hier if i.group == "ep_cross"]
    intra = [i for i in hier if i.group == "ep_node"]
    assert inter and all(i.nbytes == pytest.approx(tokens * d * h * 2) for i in inter)
    assert {i.nbytes for i in intra} == {tokens * k * h * 2}
    # every dispatch has its combine, both stages, forward and backward, every layer
    # and both microbatches (32 sequences over dp 16)
    count = Counter((i.layer, i.group, i.name.rsplit(".", 1)[-1]) for i in hier)
    assert set(count.values()) == {2 * 2} and len(count) == 4 * 2 * 2
    limited = _exchanges(["moe.dispatcher=hierarchical", "moe.max_nodes_per_token=1"])
    assert {i.nbytes for i in limited if i.group == "ep_cross"} == {tokens * 1 * h * 2}


def test_hierarchical_is_faster_across_nodes_the_same_inside_one_and_folds() -> None:
    flat = _run()
    hier = _run("moe.dispatcher=hierarchical")
    limited = _run("moe.dispatcher=hierarchical", "moe.max_nodes_per_token=1")
    assert limited < hier < flat
    folded = _run("moe.dispatcher=hierarchical", fidelity="folded")
    assert folded == pytest.approx(hier, rel=0.01)
    one_node = ("parallelism.ep=8",)
    assert _run(*one_node, "moe.dispatcher=hierarchical") == _run(*one_node)


@pytest.mark.parametrize(
    ("sets", "key"),
    [
        (["moe.dispatcher=tree"], "moe.dispatcher"),
        (["moe.max_nodes_per_token=-1"], "moe.max_nodes_per_token"),
    ],
)
def test_bad_input_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sets: list[str], key: str
) -> None:
    check_refuses(tmp_path, capsys, SCENARIO, sets, key)


def test_hierarchical_exchanges_overlap_across_microbatches() -> None:
    hier = _run("moe.dispatcher=hierarchical", "training.global_batch_size=64")
    both = _run(
        "moe.dispatcher=hierarchical",
        "training.global_batch_size=64",
        "parallelism.overlap_moe_a2a=true",
    )
    assert both < hier
    folded = _run(
        "moe.dispatcher=hierarchical",
        "training.global_batch_size=64",
        "parallelism.overlap_moe_a2a=true",
        fidelity="folded",
    )
    assert folded == pytest.approx(both, rel=0.01)


def test_flat_dispatcher_sorts_by_local_expert_and_back() -> None:
    from clustersim.workload.layers import moe_sublayer
    from clustersim.workload.moe import stage_routing
    from clustersim.workload.ops import ACT_BYTES

    def ops(*sets: str) -> tuple[dict[str, Any], Any]:
        res = load_scenario(SCENARIO, list(sets))
        sc = res.scenario
        lay = make_layout(sc.parallelism, res.ranks, res.ranks_per_chip, res.ranks_per_node)
        part = moe_sublayer(res.model, sc.parallelism, sc.training, lay, cfg=sc.moe)
        assert part is not None
        route = stage_routing(res.model, sc.parallelism, sc.training, lay, cfg=sc.moe)
        templates = (*part.forward("fwd"), *part.bwd)
        return Counter(f"{t[2]}:{t[1]}" for t in templates), (templates, route, res)

    count, (templates, route, res) = ops("parallelism.ep=8")  # 2 local experts
    assert [count[f"{p}:moe.{s}"] for p in ("fwd", "bwd") for s in ("sort", "unsort")] == [1] * 4
    sort = next(t[3] for t in templates if t[1] == "moe.sort")
    elems = route.received * res.model.hidden
    assert sort.hbm_bytes == 2 * ACT_BYTES * elems  # each row read and written once
    assert not ops("parallelism.ep=16")[0]["fwd:moe.sort"]  # one local expert: no sort
    wide = "model.moe.experts=32"  # ep 16 over two nodes, two local experts
    assert ops(wide)[0]["fwd:moe.sort"]
    assert not ops(wide, "moe.dispatcher=hierarchical")[0]["fwd:moe.sort"]


def test_hierarchical_runs_its_nvlink_part_beside_the_inter_node_one() -> None:
    """DeepEP forwards inside the node what arrives across nodes as it arrives
    (arXiv 2412.19437 section 3.2.2): each exchange starts its ``ep_node``
    all-to-all without waiting, runs the ``ep_cross`` one, then waits for the first,
    so the two run at once and the exchange takes the longer, not the sum."""
    res = load_scenario(SCENARIO, ["moe.dispatcher=hierarchical"])
    sc = res.scenario
    layout = make_layout(sc.parallelism, res.ranks, res.ranks_per_chip, res.ranks_per_node)
    prog = build_programs(res.model, sc.parallelism, sc.training, layout, moe=sc.moe)[0]
    ins = prog.instrs
    starts = [j for j, i in enumerate(ins) if i.group == "ep_node" and i.nbytes]
    assert starts and sum(i.group == "ep_node" for i in ins) == 2 * len(starts)
    for j in starts:
        assert ins[j].kind == Kind.ASYNC_COLLECTIVE
        assert (ins[j + 1].kind, ins[j + 1].group) == (Kind.COLLECTIVE, "ep_cross")
        assert (ins[j + 2].kind, ins[j + 2].group, ins[j + 2].tag) == (
            Kind.WAIT_ASYNC,
            "ep_node",
            0,
        )
    frame = simulate(res, fidelity="detailed").trace_frame()
    rank0 = frame[frame["rank"] == 0]
    inter = rank0[rank0["resource"] == "ep_cross:all_to_all"]
    intra = rank0[rank0["resource"] == "ep_node:all_to_all"]
    assert len(inter) == len(intra) == len(starts)
    assert list(intra["start_s"]) == pytest.approx(list(inter["start_s"]))
