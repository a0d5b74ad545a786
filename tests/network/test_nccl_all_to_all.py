"""NCCL's all-to-all across nodes: one group of sends and receives, posted by the proxy.

torch's ``all_to_all_single`` posts a send and a receive per peer in one NCCL group, so
across nodes every pair moves at once (``mesh``) after one launch and one network hop,
and each rank's proxy posts a message per chunk of every block bound for another node
(``catalog/runtimes.yaml``, ``nccl.p2p``). Inside one node ``auto`` keeps ``pairwise``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from clustersim import catalog
from clustersim.errors import ScenarioError
from clustersim.network.collectives import GroupInfo
from clustersim.network.microbench import run_collective
from clustersim.network.runtimes import nccl_tables, runtime_of

ROOT = Path(__file__).resolve().parents[2]
PER_NODE = 8  # GPUs of a p5.48xlarge


def _nodes(nodes: int, per_node: int = PER_NODE) -> GroupInfo:
    p = nodes * per_node
    return GroupInfo(tuple(range(p)), tuple(i // per_node for i in range(p)))


def _by_hand(nodes: int, n: float) -> tuple[float, float, float]:
    """(time, posting, wire) of an all-to-all of ``n`` bytes over ``nodes`` x p5.48xlarge:
    launch + network hop + route latency + max(posting, wire), from the catalog alone."""
    chip, inst = catalog.chip("h100"), catalog.instance("p5.48xlarge")
    t = nccl_tables()
    p, local = nodes * PER_NODE, PER_NODE
    proto = "LL" if n / p <= t.p2p.ll_threshold_bytes else "Simple"
    simple = proto == "Simple"
    latency = (
        t.base_us["ring"][proto]
        + t.net_hop_us["ring"][proto]
        + t.net_post_us * (3 if simple else 1)
    ) * 1e-6 + (2 if simple else 1) * inst.efa.latency_s
    nic = inst.efa.bandwidth_Bps / inst.chips * chip.efa_link_efficiency
    nvlink = inst.fabric.link_bw_Bps * chip.calibration.link_efficiency
    factor = t.bandwidth_factor["ring"][proto]
    wire = max((p - local) / p * n / nic, (local - 1) / p * n / nvlink) / factor
    messages = (p - local) * max(1, math.ceil(n / p / t.p2p.chunk_bytes))
    posting = messages * t.p2p.message_us * 1e-6
    return latency + max(posting, wire), posting, wire


@pytest.mark.parametrize(
    ("nodes", "n", "posting_binds"),
    [(8, 2.0**20, True), (2, 2.0**16, True), (2, 2.0**24, False), (4, 2.0**28, False)],
)
def test_across_nodes_closed_form(nodes: int, n: float, posting_binds: bool) -> None:
    (row,) = run_collective("p5.48xlarge", nodes, "all_to_all", [n])
    want, posting, wire = _by_hand(nodes, n)
    assert row["algorithm"] == "mesh"
    assert (posting > wire) is posting_binds
    assert row["time_s"] == pytest.approx(want, rel=1e-6)
    rt = runtime_of(catalog.chip("h100"), catalog.instance("p5.48xlarge"))
    info = _nodes(nodes)
    algo, proto = rt.choose("all_to_all", nodes * PER_NODE, n, info, "auto")
    assert rt.predict_s("all_to_all", nodes * PER_NODE, n, info, (algo, proto.name)) == (
        pytest.approx(want, rel=1e-9)
    )


def test_far_cheaper_than_pairwise_rounds_across_nodes_equal_on_one() -> None:
    small = 2.0**16
    (grouped,) = run_collective("p5.48xlarge", 8, "all_to_all", [small])
    (rounds,) = run_collective("p5.48xlarge", 8, "all_to_all", [small], algorithm="pairwise")
    assert rounds["algorithm"] == "pairwise"
    # 63 rounds, each with a hop and, for 56 of them, a network route, against one
    assert grouped["time_s"] < rounds["time_s"] / 5
    for n in (small, 2.0**26):
        (auto,) = run_collective("p5.48xlarge", 1, "all_to_all", [n])
        (forced,) = run_collective("p5.48xlarge", 1, "all_to_all", [n], algorithm="pairwise")
        assert auto["algorithm"] == "pairwise"
        assert auto["time_s"] == forced["time_s"]
    again = run_collective("p5.48xlarge", 8, "all_to_all", [small])[0]
    assert again == grouped


def test_the_choice_is_deterministic_and_pairwise_stays_when_asked() -> None:
    rt = runtime_of(catalog.chip("h100"), catalog.instance("p5.48xlarge"))
    two = _nodes(2)
    picks = {rt.choose("all_to_all", 16, 2.0**24, two, "auto") for _ in range(3)}
    assert len(picks) == 1 and next(iter(picks))[0] == "mesh"
    algo, proto = rt.choose("all_to_all", 16, 2.0**24, two, "pairwise")
    assert algo == "pairwise" and proto.message_Bps == math.inf
    assert rt.choose("all_to_all", 8, 2.0**24, _nodes(1), "auto")[0] == "pairwise"
    # an explicit mesh inside one node runs as before: one round, an NVLink hop
    one = rt.choose("all_to_all", 8, 2.0**24, _nodes(1), "mesh")[1]
    assert one.message_Bps == math.inf and one.route_intra == 0.0


def test_posting_counts_chunks_of_blocks_bound_for_other_nodes() -> None:
    rt = runtime_of(catalog.chip("h100"), catalog.instance("p5.48xlarge"))
    chunk, us = nccl_tables().p2p.chunk_bytes, 1e-6
    message = nccl_tables().p2p.message_us * us
    four = _nodes(4)
    assert rt.posting_s(32, 32.0, four) == pytest.approx(24 * message)
    assert rt.posting_s(32, 32 * 2.5 * chunk, four) == pytest.approx(24 * 3 * message)
    # nodes of unequal size: the rank on the smallest node has the most remote peers
    uneven = GroupInfo(tuple(range(10)), (0,) * 8 + (1,) * 2)
    assert rt.posting_s(10, 10.0, uneven) == pytest.approx(8 * message)
    # a chip's collectives.efa_message_s overrides the catalog's default
    assert replace(rt, message_s=10 * us).posting_s(32, 32.0, four) == pytest.approx(240 * us)
    chip = catalog.chip("h100")
    costly = chip.model_copy(
        update={"collectives": chip.collectives.model_copy(update={"efa_message_s": 10 * us})}
    )
    slow = runtime_of(costly, catalog.instance("p5.48xlarge"))
    assert slow.posting_s(32, 32.0, four) == pytest.approx(240 * us)


def test_an_algorithm_not_for_all_to_all_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from clustersim.cli import main

    with pytest.raises(ScenarioError, match="algorithm"):
        run_collective("p5.48xlarge", 2, "all_to_all", [1.0], algorithm="ring")
    scenario = ROOT / "scenarios" / "p5-qwen3-30b-a3b.yaml"
    code = main(["check", str(scenario), "--set", "cluster.collectives.all_to_all=ring"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("clustersim: error: cluster.collectives.all_to_all")
    assert "Traceback" not in err
