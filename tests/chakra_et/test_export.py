"""``clustersim export chakra``: the traces it writes, and export then import keeping the
step time of the shipped examples (fewer layers, for the tests' time; every shipped
training example, and three whole, in the slow suite)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from clustersim.chakra import NodeType, read_file
from clustersim.cli import main
from clustersim.docexamples import ROUND_TRIPS as SHIPPED
from clustersim.docexamples import chakra_round_trip
from clustersim.scenario import load_scenario, resolve
from clustersim.sim import simulate
from clustersim.sim.chakra_export import export_chakra
from clustersim.sim.run import compile_programs, plan
from tests.chakra_et.helpers import mlc, mlc_decode

ROOT = Path(__file__).resolve().parents[2]
ROUND_TRIPS = [
    ("trn2-llama3-8b", ["model.layers=2"]),
    ("p5-llama3-8b", ["model.layers=4"]),
    # FSDP's all-gathers share HBM with compute: the import asks for each run's mean rate
    ("mbridge-llama3-8b-fsdp", ["model.layers=4"]),
]


@pytest.mark.parametrize(("name", "sets"), ROUND_TRIPS)
def test_export_then_import_keeps_the_step_time(name: str, sets: list[str], tmp_path: Path) -> None:
    res = load_scenario(ROOT / "scenarios" / f"{name}.yaml", sets)
    built = simulate(res, record=False).summary
    pl = plan(res)
    export_chakra(pl, compile_programs(pl), tmp_path, "t")
    data = {
        "name": "imported",
        "cluster": res.raw["cluster"],
        "workload": {"chakra": str(tmp_path / "t")},
        "training": {"steps": 1},
    }
    imported = simulate(resolve(data), record=False).summary
    assert imported["step_time_s"] == pytest.approx(built["step_time_s"], rel=1e-3)
    assert imported["breakdown_s"]["exposed_comm"] == pytest.approx(
        built["breakdown_s"]["exposed_comm"], rel=1e-2
    )


WHOLE = [("p5-llama3-8b", ()), ("trn2-llama3-8b", ()), ("p5-qwen3-30b-a3b", ())]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "sets"),
    [pytest.param(n, s, id=f"{n}-cut") for n, s, _ in SHIPPED]
    + [pytest.param(n, s, id=f"{n}-whole") for n, s in WHOLE],
)
def test_every_shipped_example_round_trips(name: str, sets: tuple[str, ...]) -> None:
    """The documentation's round-trip table (each example cut to run in seconds), and
    three examples whole (``p5-qwen3-30b-a3b`` takes minutes)."""
    built, imported, nodes = chakra_round_trip(name, sets)
    assert nodes > 0
    assert imported == pytest.approx(built, rel=1e-3)


def test_attribute_types_as_astra_sim_reads_them(tmp_path: Path) -> None:
    scenario = ROOT / "scenarios" / "trn2-llama3-8b.yaml"
    args = [
        "export",
        "chakra",
        str(scenario),
        "--out",
        str(tmp_path),
        "--prefix",
        "x",
        "--set",
        "model.layers=1",
        "--rank",
        "5",
        "--rank",
        "9",
    ]
    assert main(args) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["comm_group.json", "x.5.et", "x.9.et"]
    groups = json.loads((tmp_path / "comm_group.json").read_text())
    et = read_file(tmp_path / "x.5.et")
    assert et.metadata.version == "0.0.4"
    kinds = {
        NodeType.COMP_NODE: {"is_cpu_op": "bool", "num_ops": "int64", "tensor_size": "uint64"},
        NodeType.COMM_COLL_NODE: {
            "is_cpu_op": "bool",
            "comm_type": "int64",
            "comm_size": "int64",
            "pg_name": "string",
        },
    }
    seen = set()
    for node in et.nodes:
        assert {a.name: a.kind for a in node.attrs} == kinds[NodeType(node.type)]
        seen.add(node.type)
        if node.type == NodeType.COMM_COLL_NODE:
            pg = node.attr("pg_name")
            assert pg is not None and 5 in groups[pg.value]
        assert all(d < node.id for d in node.data_deps)
    assert seen == set(kinds)
    assert any(n.duration_micros > 0 for n in et.nodes)


def test_gzip_output_reads_back(tmp_path: Path) -> None:
    scenario = ROOT / "scenarios" / "p5-llama3-8b.yaml"
    args = [
        "export",
        "chakra",
        str(scenario),
        "--out",
        str(tmp_path),
        "--gzip",
        "--rank",
        "0",
        "--set",
        "model.layers=1",
    ]
    assert main(args) == 0
    path = tmp_path / "p5-llama3-8b.0.et.gz"
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    assert read_file(path).nodes
    assert gzip.decompress(path.read_bytes())  # a plain gzip stream


def test_export_refuses_a_trace_and_bad_ranks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = ROOT / "scenarios" / "p5-llama3-8b.yaml"
    assert main(["export", "chakra", str(scenario), "--out", str(tmp_path), "--rank", "8"]) == 2
    assert "--rank: the scenario has ranks 0..7 (got 8)" in capsys.readouterr().err


@mlc
def test_mlc_chakra_decodes_an_exported_llama3_8b_trn2_step(tmp_path: Path) -> None:
    """The reference decoder reads every node and attribute of an exported step as we do."""

    args = ["export", "chakra", str(ROOT / "scenarios" / "trn2-llama3-8b.yaml"), "--out",
            str(tmp_path), "--prefix", "x", "--set", "model.layers=1", "--rank", "0",
            "--rank", "63"]  # fmt: skip
    assert main(args) == 0
    for rank in (0, 63):
        path = tmp_path / f"x.{rank}.et"
        meta, theirs = mlc_decode(path)
        mine = read_file(path).nodes
        assert meta.version == "0.0.4" and len(theirs) == len(mine) > 100
        for t, m in zip(theirs, mine, strict=True):
            assert (t.id, t.type, t.duration_micros, list(t.data_deps)) == (
                m.id, m.type, m.duration_micros, m.data_deps,
            )  # fmt: skip
            assert [(a.name, getattr(a, a.WhichOneof("value"))) for a in t.attr] == [
                (a.name, a.value) for a in m.attrs
            ]
