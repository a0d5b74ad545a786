"""Hostile fabric files (``cluster.fabric_file``): each is refused with exit 2 and one line,
within seconds, and nothing is fetched or expanded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clustersim.network.graphs import graphio

from .harness import assert_contract, case_dir, run_cli, write

WHERE = "cluster.fabric_file"


def scenario(fabric: Path) -> str:
    return f"""\
name: hostile-fabric
cluster: {{instance: p5.48xlarge, count: 1, fabric_file: {json.dumps(str(fabric))}}}
model: {{name: tiny, layers: 4, hidden: 1024, heads: 8, kv_heads: 2, ffn_hidden: 4096, vocab: 8192}}
parallelism: {{tp: 8, pp: 1}}
training: {{seq_len: 1024, global_batch_size: 8, steps: 1}}
"""


def ring_json(n: int = 8, **edge: object) -> dict[str, object]:
    nodes = [{"id": f"g{i}", "kind": "chip", "instance": 0} for i in range(n)]
    edges = [
        {"source": f"g{i}", "target": f"g{(i + 1) % n}", "capacity_Bps": 1e11, "latency_s": 1e-6}
        for i in range(n)
    ]
    edges[0].update(edge)
    return {"directed": False, "multigraph": False, "graph": {}, "nodes": nodes, "edges": edges}


GRAPHML_HEAD = '<?xml version="1.0"?>\n'
GRAPHML_BODY = (
    '<graphml xmlns="http://graphml.graphdrawing.org/xmlns">'
    '<graph edgedefault="undirected"><node id="a">&e;</node></graph></graphml>'
)
BILLION_LAUGHS = (
    GRAPHML_HEAD
    + "<!DOCTYPE graphml [\n"
    + '<!ENTITY e0 "lol">\n'
    + "".join(f'<!ENTITY e{i} "{f"&e{i - 1};" * 10}">\n' for i in range(1, 10))
    + '<!ENTITY e "&e9;">\n]>\n'
    + GRAPHML_BODY
)
EXTERNAL = (
    GRAPHML_HEAD
    + '<!DOCTYPE graphml [<!ENTITY e SYSTEM "http://169.254.169.254/latest/meta-data/">]>\n'
    + GRAPHML_BODY
)
LOCAL_FILE = GRAPHML_HEAD + '<!DOCTYPE graphml [<!ENTITY e SYSTEM "file:///etc/passwd">]>\n'
LOCAL_FILE += GRAPHML_BODY
DEEP_XML = GRAPHML_HEAD + "<graphml>" + "<a>" * 50_000 + "</a>" * 50_000 + "</graphml>"
DEEP_GML = "graph [ " + "x [ " * 50_000 + "]" * 50_001
DEEP_JSON = "[" * 200_000 + "]" * 200_000


def graphml_parallel_edges() -> str:
    nodes = "".join(
        f'<node id="g{i}"><data key="k">chip</data><data key="i">0</data></node>' for i in range(8)
    )
    edge = '<edge source="g0" target="g1"><data key="c">1e11</data><data key="l">1e-6</data></edge>'
    return (
        GRAPHML_HEAD + '<graphml xmlns="http://graphml.graphdrawing.org/xmlns">'
        '<key id="k" for="node" attr.name="kind" attr.type="string"/>'
        '<key id="i" for="node" attr.name="instance" attr.type="int"/>'
        '<key id="c" for="edge" attr.name="capacity_Bps" attr.type="double"/>'
        '<key id="l" for="edge" attr.name="latency_s" attr.type="double"/>'
        f'<graph edgedefault="undirected">{nodes}{edge}{edge}</graph></graphml>'
    )


CASES = [
    pytest.param(BILLION_LAUGHS, "f.graphml", "DTD", id="billion-laughs"),
    pytest.param(EXTERNAL, "f.graphml", "DTD", id="external-entity-http"),
    pytest.param(LOCAL_FILE, "f.graphml", "DTD", id="external-entity-file"),
    pytest.param(DEEP_XML, "f.graphml", "nested deeper", id="deep-xml"),
    pytest.param(DEEP_GML, "f.gml", "nested deeper", id="deep-gml"),
    pytest.param(DEEP_JSON, "f.json", "nested too deeply", id="deep-json"),
    pytest.param("<graphml><graph>", "f.graphml", "not well-formed", id="truncated-xml"),
    pytest.param(bytes(range(256)) * 64, "f.graphml", "binary data", id="binary-junk"),
    pytest.param(b"\xff\xfe\xfd graph [", "f.gml", "not UTF-8", id="not-utf8"),
    pytest.param("graph [ node [ id 0 ", "f.gml", "not a gml fabric", id="truncated-gml"),
    pytest.param('{"nodes": 3}', "f.json", "not node-link JSON", id="json-not-node-link"),
    pytest.param("[1, 2]", "f.json", "not node-link JSON", id="json-list"),
    pytest.param(graphml_parallel_edges(), "f.graphml", "duplicate edge", id="graphml-duplicate"),
    pytest.param(
        json.dumps(ring_json() | {"edges": ring_json()["edges"] * 2}),  # type: ignore[operator]
        "f.json",
        "duplicate edge",
        id="json-duplicate",
    ),
    pytest.param(json.dumps(ring_json(target="g0")), "f.json", "self-loop", id="self-loop"),
    pytest.param(
        json.dumps(ring_json(capacity_Bps=float("nan"))), "f.json", "positive", id="nan-capacity"
    ),
    pytest.param(json.dumps(ring_json(lanes=1.5)), "f.json", "whole number", id="fractional-lanes"),
    pytest.param(
        json.dumps(ring_json(capacty_Bps=1.0)), "f.json", "did you mean", id="misspelt-attribute"
    ),
    pytest.param(json.dumps(ring_json(6)), "f.json", "has 6 chips", id="missing-chips"),
    pytest.param("graph [ ]", "f.txt", "suffix", id="unknown-suffix"),
]


@pytest.mark.parametrize(("content", "name", "phrase"), CASES)
def test_hostile_fabric_files_exit_2(content: str | bytes, name: str, phrase: str) -> None:
    with case_dir() as d:
        fabric = write(d, content, name)
        outcome = run_cli(["check", str(write(d, scenario(fabric)))])
    where = assert_contract(outcome)
    assert where is not None and where.startswith(WHERE), str(outcome)
    assert outcome.rc == 2 and phrase in outcome.err, str(outcome)
    assert outcome.seconds < 5.0, str(outcome)


def test_a_valid_hand_made_fabric_checks() -> None:
    with case_dir() as d:
        fabric = write(d, json.dumps(ring_json()), "f.json")
        outcome = run_cli(["check", str(write(d, scenario(fabric)))])
    assert assert_contract(outcome) is None and outcome.rc == 0, str(outcome)


def test_oversized_files_are_refused_unread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graphio, "MAX_FABRIC_BYTES", 2**20)
    with case_dir() as d:
        fabric = write(d, json.dumps(ring_json()) + " " * 2**20, "f.json")
        outcome = run_cli(["check", str(write(d, scenario(fabric)))])
    assert assert_contract(outcome) == WHERE and "larger than 1 MiB" in outcome.err


def test_too_many_nodes_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graphio, "MAX_GRAPH_NODES", 100)
    data = ring_json()
    data["nodes"] = [*data["nodes"], *({"id": f"s{i}"} for i in range(200))]  # type: ignore[misc]
    with case_dir() as d:
        fabric = write(d, json.dumps(data), "f.json")
        outcome = run_cli(["check", str(write(d, scenario(fabric)))])
    assert assert_contract(outcome) == WHERE and "at most 100 nodes" in outcome.err


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_devices_and_missing_files_are_refused() -> None:
    for target, phrase in (("/dev/zero", "not a regular file"), ("/no/f.json", "no such file")):
        with case_dir() as d:
            outcome = run_cli(["check", str(write(d, scenario(Path(target))))])
        assert assert_contract(outcome) == WHERE, str(outcome)
        assert outcome.rc == 2 and phrase in outcome.err, str(outcome)
