"""Bad traces exit 2 with one line naming the file, the node id and the field."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from clustersim.chakra import Attr, EtFile, GlobalMetadata, Node, NodeType, decode_file, encode_file
from clustersim.chakra.graph import build_graph
from clustersim.cli import main
from clustersim.errors import ScenarioError
from clustersim.scenario import resolve
from clustersim.sim import simulate
from tests.chakra_et.helpers import coll, comp, ring_scenario, write_traces


def fails(tmp_path: Path, per_rank: list[list[Node]], match: str, **chakra: object) -> None:
    prefix = write_traces(tmp_path, per_rank)
    with pytest.raises(ScenarioError, match=match):
        simulate(resolve(ring_scenario(4, prefix, **chakra)))


def test_unknown_node_type(tmp_path: Path) -> None:
    fails(
        tmp_path,
        [[Node(3, "x", 12)]],
        r"t\.0\.et\[node 3\]\.type: unknown node type",
        replicate=True,
    )


def test_unknown_comm_type(tmp_path: Path) -> None:
    fails(
        tmp_path,
        [[coll(5, 42, 8)]],
        r"\[node 5\]\.comm_type: unknown is not simulated; 0 ALL_REDUCE, .*, 9 BARRIER \(got 42\)",
        replicate=True,
    )


def test_missing_dependency_and_dangling_ctrl_deps(tmp_path: Path) -> None:
    fails(
        tmp_path,
        [[comp(1, 1, (9,))]],
        r"\[node 1\]\.data_deps: no node has this id \(got 9\)",
        replicate=True,
    )
    dangling = [Node(1, "c", NodeType.COMP_NODE, ctrl_deps=[77], duration_micros=3)]
    fails(tmp_path, [dangling], r"\[node 1\]\.ctrl_deps: no node has this id", replicate=True)
    prefix = write_traces(tmp_path, [dangling])
    s = simulate(
        resolve(ring_scenario(4, prefix, replicate=True, drop_dangling_ctrl_deps=True))
    ).summary
    assert s["step_time_s"] == pytest.approx(3e-6) and s["workload"]["dropped_ctrl_deps"] == 1


def test_cycle(tmp_path: Path) -> None:
    nodes = [comp(0, 1), comp(1, 1, (0, 3)), comp(2, 1, (1,)), comp(3, 1, (2,))]
    fails(
        tmp_path, [nodes], r"\[node \d\]\.data_deps: the dependencies form a cycle", replicate=True
    )


def test_comm_sizes(tmp_path: Path) -> None:
    no_size = Node(2, "c", NodeType.COMM_COLL_NODE, attrs=[Attr("comm_type", "int64", 0)])
    fails(tmp_path, [[no_size]], r"\[node 2\]\.comm_size: missing", replicate=True)
    fails(
        tmp_path,
        [[coll(4, 0, 2**40 + 1)]],
        r"\[node 4\]\.comm_size: must be 0 B .. 1 TiB",
        replicate=True,
    )
    huge = [comp(0, 1, tensor_size=2**41)]
    fails(tmp_path, [huge], r"\[node 0\]\.tensor_size: must be 0 B .. 1 TiB", replicate=True)


def test_groups(tmp_path: Path) -> None:
    fails(
        tmp_path,
        [[coll(1, 0, 8, pg="5")]],
        r"\[node 1\]\.pg_name: no process group",
        replicate=True,
    )
    (tmp_path / "comm_group.json").write_text('{"5": [0, 1]}')
    fails(tmp_path, [[coll(1, 0, 8, pg="5")]], r"rank 2 runs this collective", replicate=True)
    (tmp_path / "comm_group.json").write_text('{"5": [0, 9]}')
    fails(tmp_path, [[coll(1, 0, 8, pg="5")]], r"comm_groups\['5'\]", replicate=True)


def test_disagreeing_collectives_and_deadlock(tmp_path: Path) -> None:
    fails(
        tmp_path,
        [[coll(0, 0, 8)], [coll(0, 0, 16)], [coll(0, 0, 8)], [coll(0, 0, 8)]],
        r"t\.1\.et\[node 0\]\.comm_size: collective 0 of group '0' is all_reduce of 8 B",
    )
    recv = Node(
        0,
        "r",
        NodeType.COMM_RECV_NODE,
        attrs=[Attr("comm_src", "int32", 1), Attr("comm_size", "int64", 8)],
    )
    fails(
        tmp_path / "d",
        [[recv]],
        r"deadlock in step 0: t\.0\.et waits at node 0 \(r\)",
        replicate=True,
    )


def test_rank_files_must_match_the_cluster(tmp_path: Path) -> None:
    fails(tmp_path, [[comp(0, 1)]] * 3, r"the cluster has 4 ranks but there is no PREFIX\.3\.et")
    fails(tmp_path / "b", [[comp(0, 1)]] * 5, r"5 rank files for a cluster of 4 ranks")


def test_cli_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = write_traces(tmp_path, [[comp(0, 1)]])
    (tmp_path / "t.0.et").write_bytes(b"\x05\x0a\x03\x30")  # metadata cut short
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(ring_scenario(4, prefix, replicate=True)))
    assert main(["run", str(scenario), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        "clustersim: error: t.0.et[GlobalMetadata, byte 0]: not a Chakra trace: truncated"
    )


def test_model_keys_and_trace_exclude_each_other() -> None:
    data = ring_scenario(4, "x") | {"model": "llama3-8b"}
    with pytest.raises(ScenarioError, match="model and workload exclude each other"):
        resolve(data)
    data = ring_scenario(4, "x") | {"training": {"steps": 1, "seq_len": 8}}
    with pytest.raises(ScenarioError, match=r"training\.seq_len does not apply"):
        resolve(data)


def _big_trace(n: int) -> bytes:
    cpu = Attr("is_cpu_op", "bool", False)
    nodes = []
    for i in range(n):
        deps = [i - 1] if i else []
        if i % 4 == 3:
            attrs = [
                cpu,
                Attr("comm_type", "int64", 0),
                Attr("comm_size", "int64", 1 << 20),
                Attr("pg_name", "string", "0"),
            ]
            nodes.append(Node(i, f"ar{i}", NodeType.COMM_COLL_NODE, data_deps=deps, attrs=attrs))
        else:
            attrs = [
                cpu,
                Attr("num_ops", "int64", 10**9 + i),
                Attr("tensor_size", "uint64", 1 << 22),
            ]
            nodes.append(
                Node(
                    i, f"mm{i}", NodeType.COMP_NODE, data_deps=deps, duration_micros=13, attrs=attrs
                )
            )
    return encode_file(EtFile(GlobalMetadata("0.0.4"), nodes))


@pytest.mark.slow
def test_200k_nodes_load_in_under_10_s() -> None:
    """Timed in CPU seconds, which a machine busy with other work does not inflate."""
    data = _big_trace(200_000)
    t0 = time.process_time()
    graph = build_graph(decode_file(data, "big.0.et"), "big.0.et")
    took = time.process_time() - t0
    assert graph.size == 200_000 and took < 10.0
