"""A plain node-link JSON fabric read without networkx checks as networkx's reading does."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import pytest
from test_graph_export import FAMILIES, family_topology

from clustersim.bench.fabrics import fabric_graph_data
from clustersim.errors import ScenarioError
from clustersim.network.graphs import check_fabric, fabric_graph, graphio
from clustersim.network.graphs.plaingraph import plain_graph

WHERE = "cluster.fabric_file"
ROOT = Path(__file__).resolve().parents[2]


def both(data: dict[str, Any]) -> tuple[Any, Any]:
    plain = plain_graph(copy.deepcopy(data), "edges")
    assert plain is not None
    return plain, nx.node_link_graph(copy.deepcopy(data), edges="edges")


def spec_or_error(g: Any, cpi: int, instances: int) -> Any:
    try:
        return check_fabric(g, chips_per_instance=cpi, instances=instances, where=WHERE)
    except ScenarioError as exc:
        return str(exc)


def assert_same_reading(data: dict[str, Any], cpi: int, instances: int) -> None:
    plain, g = both(data)
    assert list(plain.nodes(data=True)) == list(g.nodes(data=True))
    assert list(plain.edges(data=True)) == list(g.edges(data=True))
    assert plain.graph == g.graph
    assert plain.number_of_edges() == g.number_of_edges()
    assert plain.number_of_nodes() == g.number_of_nodes()
    a, b = spec_or_error(plain, cpi, instances), spec_or_error(g, cpi, instances)
    if isinstance(b, str):
        assert a == b
        return
    for f in fields(b):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(y, np.ndarray):
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y, f.name


@pytest.mark.parametrize("shape", ["switch", "ring"])
def test_bench_fabrics(shape: str) -> None:
    assert_same_reading(fabric_graph_data(shape, 64), 16, 4)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_exported_families(family: str) -> None:
    topo = family_topology(family)
    data = nx.node_link_data(fabric_graph(topo), edges="edges")
    assert_same_reading(data, topo.chips_per_instance, topo.instances)


def test_repeats_missing_nodes_self_loops_and_directions() -> None:
    data = fabric_graph_data("switch", 8)
    edges = data["edges"]
    edges.append({"source": "switch0", "target": "chip3", "latency_s": 9e-6, "lanes": 2})
    edges.append({"source": "chip5", "target": "extra", "capacity_Bps": 1e9, "latency_s": 1e-6})
    data["nodes"].append({"id": "chip2", "label": "again"})
    data["nodes"].insert(3, {"id": 7, "kind": "switch"})
    for directed in (False, True):
        data["directed"] = directed
        assert_same_reading(data, 8, 1)
    edges.append({"source": "chip1", "target": "chip1", "capacity_Bps": 1e9, "latency_s": 1e-6})
    assert_same_reading(data, 8, 1)


@pytest.mark.parametrize(
    "change",
    [
        {"multigraph": True},
        {"directed": 1},
        {"graph": []},
        {"nodes": [{"id": ["a", 1]}]},
        {"nodes": [{"kind": "switch"}]},
        {"nodes": [{"id": True}]},
        {"edges": [{"source": "chip0"}]},
    ],
)
def test_anything_else_goes_to_networkx(change: dict[str, Any]) -> None:
    data = fabric_graph_data("switch", 4)
    for key, value in change.items():
        data[key] = value if key not in ("nodes", "edges") else data[key] + value
    assert plain_graph(data, "edges") is None


def test_multigraph_unless_said_otherwise() -> None:
    data = fabric_graph_data("switch", 4)
    del data["multigraph"]  # networkx's default: a multigraph
    assert plain_graph(data, "edges") is None


def test_a_plain_file_is_read_without_networkx(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_text(json.dumps(fabric_graph_data("switch", 32)))
    probe = (
        "import sys; from pathlib import Path; from clustersim.network.graphs import graphio; "
        f"g = graphio.read_fabric(Path({str(path)!r}), 'f'); "
        "print(g.number_of_nodes(), 'networkx' in sys.modules, 'scipy' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["33", "False", "False"]
    assert graphio.read_fabric(path, "f").number_of_edges() == 32
