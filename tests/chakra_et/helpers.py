"""Small traces written for the tests, and the scenario that runs them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from clustersim.chakra import Attr, EtFile, GlobalMetadata, Node, NodeType, encode_file

DATA = Path(__file__).parent / "data"
ASTRA = DATA / "astra-sim"
CPU = Attr("is_cpu_op", "bool", False)

mlc = pytest.mark.skipif(
    importlib.util.find_spec("chakra") is None
    or importlib.util.find_spec("google.protobuf") is None,
    reason="mlc-chakra is not installed "
    "(pip install --no-deps mlc-chakra==1.0.0 'protobuf>=6.31.1')",
)
"""Tests against mlc-chakra's own decoder, skipped without it."""


def mlc_decode(path: Path) -> tuple[Any, list[Any]]:
    """mlc-chakra's reading of a trace file: its metadata and nodes (protobuf messages)."""
    from chakra.schema.protobuf.et_def_pb2 import GlobalMetadata as PMeta
    from chakra.schema.protobuf.et_def_pb2 import Node as PNode
    from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd

    fh = openFileRd(str(path))
    meta = PMeta()
    assert decodeMessage(fh, meta)
    nodes = []
    node = PNode()
    while decodeMessage(fh, node):
        nodes.append(node)
        node = PNode()
    fh.close()
    return meta, nodes


def comp(i: int, us: int, deps: tuple[int, ...] = (), **attrs: int) -> Node:
    extra = [Attr(k, "int64" if k == "num_ops" else "uint64", v) for k, v in attrs.items()]
    return Node(
        i,
        f"comp{i}",
        NodeType.COMP_NODE,
        data_deps=list(deps),
        duration_micros=us,
        attrs=[CPU, *extra],
    )


def coll(
    i: int, comm_type: int, size: int, deps: tuple[int, ...] = (), pg: str | None = None
) -> Node:
    attrs = [CPU, Attr("comm_type", "int64", comm_type), Attr("comm_size", "int64", size)]
    if pg is not None:
        attrs.append(Attr("pg_name", "string", pg))
    return Node(i, f"coll{i}", NodeType.COMM_COLL_NODE, data_deps=list(deps), attrs=attrs)


def write_traces(folder: Path, per_rank: list[list[Node]], prefix: str = "t") -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for rank, nodes in enumerate(per_rank):
        et = EtFile(GlobalMetadata("0.0.4"), nodes)
        (folder / f"{prefix}.{rank}.et").write_bytes(encode_file(et))
    return str(folder / prefix)


def ring_scenario(n: int, prefix: str, **chakra: Any) -> dict[str, Any]:
    """ASTRA-sim's microbenchmark fabric: a ring of ``n`` NPUs (one rank each), 50 GB/s
    links, 500 ns a hop, no runtime costs (the Neuron runtime's, zero on a GPU chip)."""
    return {
        "name": f"ring{n}",
        "cluster": {
            "instance": "gb200-nvl72-node",
            "count": n // 4,
            "fabric_file": str(DATA / f"ring{n}.json"),
            "chip": {"collectives": {"runtime": "neuron"}},
            "collectives": {"all_reduce": "ring", "all_gather": "ring", "reduce_scatter": "ring"},
        },
        "workload": {"chakra": {"prefix": prefix, **chakra}},
        "training": {"steps": 1},
        "output": {"trace": False, "html": False},
    }
