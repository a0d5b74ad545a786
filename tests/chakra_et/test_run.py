"""Running traces: ASTRA-sim's microbenchmarks against the closed forms on its fabric,
the DAG's semantics, compute modes, steps and replication."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clustersim.chakra import Attr, CommType, Node, NodeType
from clustersim.scenario import resolve
from clustersim.sim import simulate
from tests.chakra_et.helpers import ASTRA, coll, comp, ring_scenario, write_traces

MiB = 2**20
A, B = 500e-9, 1 / 50e9  # ASTRA-sim's ring: 500 ns a hop, 50 GB/s a link
ASTRA_SIM_ALL_REDUCE_8_S = 117_780e-9  # astra-sim tests/rt_template, 1 MiB on 8 NPUs


def run(data: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return simulate(resolve(data), **kw).summary


def ring_all_reduce(p: int, n: float) -> float:
    """The bidirectional ring (``ring``): 2(p-1) hops, (p-1)/p of the buffer a direction."""
    return 2 * (p - 1) * A + (p - 1) / p * n * B


@pytest.mark.parametrize(
    ("name", "closed"),
    [
        ("all_reduce", ring_all_reduce(8, MiB)),
        ("all_gather", 7 * A + 7 / 8 * MiB / 2 * B),
        ("reduce_scatter", 7 * A + 7 / 8 * MiB / 2 * B),
    ],
)
def test_astra_sim_microbenchmarks_take_the_ring_closed_form(name: str, closed: float) -> None:
    s = run(ring_scenario(8, str(ASTRA / name / name)))
    assert s["step_time_s"] == pytest.approx(closed, rel=1e-9)
    assert s["workload"]["files"] == 8 and s["mfu"] is None and s["model"] is None


def test_against_astra_sim_published_all_reduce() -> None:
    """ASTRA-sim's 117,780 ns cuts the buffer into 4 chunks run one after another (1 active
    chunk), each a unidirectional ring: 4 x 14 hops of 500 ns; ours is one bidirectional
    ring over the whole buffer: 14 hops. README, Chakra traces, gives the figures."""
    ours = run(ring_scenario(8, str(ASTRA / "all_reduce" / "all_reduce")))["step_time_s"]
    assert ours == pytest.approx(25_350.08e-9, rel=1e-9)
    chunked = 4 * (14 * A + 14 * (MiB / 4 / 8) * B)  # ASTRA-sim's chunking, no other cost
    assert chunked == pytest.approx(64_700.16e-9)
    assert ours < chunked < ASTRA_SIM_ALL_REDUCE_8_S


def test_custom_ring_all_reduce_runs_its_sends_receives_and_compute() -> None:
    """14 messages of 128 KiB one after another round the ring (each 500 ns + 2.62 us),
    and 7 reductions of 7 us on each rank."""
    s = run(ring_scenario(8, str(ASTRA / "custom_ring_allreduce" / "custom_allreduce")))
    assert s["step_time_s"] == pytest.approx(14 * (A + 131072 * B) + 49e-6, rel=1e-9)
    assert s["breakdown_s"]["compute"] == pytest.approx(49e-6)


def test_replicate_steps_and_replay_scale(tmp_path: Path) -> None:
    nodes = [comp(0, 10), coll(1, 0, MiB, (0,)), comp(2, 5, (1,))]
    prefix = write_traces(tmp_path, [nodes])
    s = run(ring_scenario(4, prefix, replicate=True, scale=2.0) | {"training": {"steps": 3}})
    step = 30e-6 + ring_all_reduce(4, MiB)
    assert s["step_time_s"] == pytest.approx(step, rel=1e-9)
    assert s["workload"] == {
        "chakra": prefix,
        "files": 1,
        "replicate": True,
        "compute": "replay",
        "nodes_per_step": 12,
        "process_groups": 1,
        "dropped_ctrl_deps": 0,
    }


def test_compute_model_is_the_roofline(tmp_path: Path) -> None:
    """num_ops at GB200's BF16 tensor peak x its efficiency, tensor_size at its HBM rate."""
    from clustersim import catalog

    chip = catalog.chip("gb200", None, "x")
    cal = chip.calibration
    peak = chip.core.tensor_tflops.get("bf16") * 1e12 * cal.tensor_efficiency
    hbm = chip.hbm_bw_Bps * cal.hbm_efficiency
    nodes = [comp(0, 999, num_ops=10**15, tensor_size=2**30), comp(1, 999, (0,), tensor_size=2**36)]
    prefix = write_traces(tmp_path, [nodes])
    s = run(ring_scenario(4, prefix, replicate=True, compute="model"))
    want = 10**15 / peak + 2**36 / hbm + 2 * cal.op_overhead_s
    assert s["step_time_s"] == pytest.approx(want, rel=1e-9)


def test_overlap_and_dependencies(tmp_path: Path) -> None:
    """Compute runs one node at a time; a collective overlaps it; data and ctrl deps hold."""
    ar = ring_all_reduce(4, MiB)
    nodes = [
        comp(0, 40),
        coll(1, 0, MiB),  # starts at once, beside node 0
        comp(2, 10),  # queued behind node 0: the rank computes one node at a time
        Node(
            3,
            "after",
            NodeType.COMP_NODE,
            ctrl_deps=[1],
            data_deps=[2],
            duration_micros=1,
            attrs=[Attr("is_cpu_op", "bool", False)],
        ),
    ]
    s = run(ring_scenario(4, write_traces(tmp_path, [nodes]), replicate=True))
    assert ar < 50e-6
    assert s["step_time_s"] == pytest.approx(51e-6, rel=1e-9)
    assert s["breakdown_s"]["exposed_comm"] == 0.0


def test_send_receive_and_groups(tmp_path: Path) -> None:
    """Rank 0 sends 1 MiB to rank 2 (two hops of the ring); groups from comm_group.json."""
    send = Node(
        0,
        "s",
        NodeType.COMM_SEND_NODE,
        attrs=[
            Attr("comm_dst", "int32", 2),
            Attr("comm_tag", "int32", 5),
            Attr("comm_size", "int64", MiB),
        ],
    )
    recv = Node(
        0,
        "r",
        NodeType.COMM_RECV_NODE,
        attrs=[
            Attr("comm_src", "int32", 0),
            Attr("comm_tag", "int32", 5),
            Attr("comm_size", "int64", MiB),
        ],
    )
    pair = coll(1, 0, MiB, (0,), pg="7")
    odd = coll(0, 0, 8, pg="8")
    prefix = write_traces(tmp_path, [[send, pair], [odd], [recv, pair], [odd]])
    (tmp_path / "comm_group.json").write_text('{"7": [0, 2], "8": [1, 3]}')
    s = run(ring_scenario(4, prefix))
    sent = 2 * A + MiB * B  # two hops, pipelined: the flow at link rate after both latencies
    # a 2-rank ring all-reduce between ranks 0 and 2: two rounds of half the buffer, one
    # direction (with two ranks a ring has one), each round over two hops
    two = 2 * 2 * A + MiB * B
    assert s["step_time_s"] == pytest.approx(sent + two, rel=1e-5)
    assert s["workload"]["process_groups"] == 2


def test_injected_straggler_and_chip_down(tmp_path: Path) -> None:
    """failures.inject acts on a trace as on a built workload: a chip computing 2x slower
    from 5 us stretches its 10 us node to 15 us; a chip down fails the step."""
    prefix = write_traces(tmp_path, [[comp(0, 10), coll(1, 0, MiB, (0,))]])
    data = ring_scenario(4, prefix, replicate=True)
    data["failures"] = {"inject": [{"at": "5us", "target": {"chip": 2}, "kind": {"straggle": 2}}]}
    s = run(data)
    assert s["step_time_s"] == pytest.approx(15e-6 + ring_all_reduce(4, MiB), rel=1e-9)
    assert s["injections"][0]["applied_s"] == pytest.approx(5e-6)
    data["failures"] = {"inject": [{"at": "12us", "target": {"chip": 1}, "kind": "down"}]}
    s = run(data)
    assert s["step_time_s"] is None and s["step_failed"]["at_s"] == pytest.approx(12e-6)


def _star(tmp_path: Path, n: int) -> str:
    """``n`` chips on one switch, 50 GB/s and 250 ns a link: 500 ns chip to chip."""
    nodes = [{"id": f"chip{i}", "instance": i // 4} for i in range(n)] + [{"id": "sw"}]
    edges = [
        {"source": f"chip{i}", "target": "sw", "capacity_Bps": 50e9, "latency_s": 250e-9}
        for i in range(n)
    ]
    path = tmp_path / f"star{n}.json"
    path.write_text(json.dumps({"directed": False, "multigraph": False, "graph": {},
                                "nodes": nodes, "edges": edges}))  # fmt: skip
    return str(path)


@pytest.mark.parametrize("comm_type", [CommType.GATHER, CommType.SCATTER])
def test_gather_and_scatter_take_the_direct_closed_form(tmp_path: Path, comm_type: int) -> None:
    """The root (the group's first rank) exchanges each other member's n/p block at once:
    its one link carries p-1 flows, so a + (p-1)/p n b; over all 4 ranks, then over the
    group [1, 2, 3] (root 1)."""
    n = 3 * MiB
    whole = coll(0, comm_type, n)
    part = coll(1, comm_type, n, (0,), pg="5")
    prefix = write_traces(tmp_path, [[whole], [whole, part], [whole, part], [whole, part]])
    (tmp_path / "comm_group.json").write_text('{"5": [1, 2, 3]}')
    data = ring_scenario(4, prefix)
    data["cluster"]["fabric_file"] = _star(tmp_path, 4)
    s = run(data)
    everyone, three = A + 3 / 4 * n * B, A + 2 / 3 * n * B
    assert s["step_time_s"] == pytest.approx(everyone + three, rel=1e-9)
    # rank 0 waits on the first, the others on both
    assert s["breakdown_s"]["exposed_comm"] == pytest.approx(everyone + 3 / 4 * three, rel=1e-9)


@pytest.mark.parametrize(("op", "root_sends"), [("scatter", True), ("gather", False)])
def test_gather_and_scatter_steps(op: str, root_sends: bool) -> None:
    """One step of p-1 flows of n/p between position 0 and every other position."""
    from clustersim.network.collectives import collective_steps

    (step,) = collective_steps(op, 5, 10.0)
    pairs = [(0, i) for i in range(1, 5)]
    assert step.pairs == tuple(pairs if root_sends else [(j, i) for i, j in pairs])
    assert step.bytes_per_flow == 2.0 and not step.reduces


def test_a_run_of_compute_nodes_asks_for_its_mean_hbm_rate(tmp_path: Path) -> None:
    """Nodes 0-1-2 are a run (each the only successor of the one before): each asks for
    the run's bytes over its time; the collective after node 2 ends it, and node 4 (two
    dependencies) starts another of one node, which keeps its own bytes."""
    import numpy as np

    from clustersim.chakra.traces import load_traces
    from clustersim.sim.chakra_run import run_hbm_bytes

    nodes = [
        comp(0, 10, tensor_size=100),
        comp(1, 30, (0,), tensor_size=700),
        comp(2, 60, (1,), tensor_size=200),
        coll(3, 0, MiB, (2,)),
        comp(4, 5, (2, 3), tensor_size=50),
    ]
    g = load_traces(write_traces(tmp_path, [nodes]), 1, replicate=True).graphs[0]
    seconds = g.duration_us * 1e-6
    got = run_hbm_bytes(g, seconds, np.nan_to_num(g.tensor_size))
    assert got.tolist() == pytest.approx([100.0, 300.0, 600.0, 0.0, 50.0])
