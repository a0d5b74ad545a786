"""The custom fabric files of the dense-traffic bench cases, written on demand.

``a2a-1024-switch`` and ``a2a-1024-ring`` run a 64 MiB all-to-all over 1,024 chips
(64 x trn2.48xlarge, one rank per chip) on a user's graph, as ``clustersim
collective --fabric-file F --op all_to_all --algorithm mesh`` would:

- ``switch``: every chip has one link each way to a single switch;
- ``ring``: chip ``i`` has one link each way to chip ``i + 1 (mod 1,024)``.

The files are node-link JSON, written by :func:`write_fabric` from the same
parameters every time, so the cases are reproducible without shipping the files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = [
    "FABRIC_CHIPS",
    "FABRIC_LINK_LATENCY_S",
    "FABRIC_LINK_Bps",
    "fabric_graph_data",
    "write_fabric",
]

FABRIC_CHIPS = 1024
CHIPS_PER_INSTANCE = 16
FABRIC_LINK_Bps = 50e9
"""Each link's capacity, each way (bytes per second)."""
FABRIC_LINK_LATENCY_S = 1e-6


def fabric_graph_data(shape: str, chips: int = FABRIC_CHIPS) -> dict[str, Any]:
    """The node-link JSON of a ``switch`` or ``ring`` fabric of ``chips`` chips."""
    nodes: list[dict[str, Any]] = [
        {"id": f"chip{i}", "instance": i // CHIPS_PER_INSTANCE} for i in range(chips)
    ]
    edge = {"capacity_Bps": FABRIC_LINK_Bps, "latency_s": FABRIC_LINK_LATENCY_S}
    if shape == "switch":
        nodes.append({"id": "switch0", "kind": "switch"})
        edges = [{"source": f"chip{i}", "target": "switch0", **edge} for i in range(chips)]
    elif shape == "ring":
        edges = [
            {"source": f"chip{i}", "target": f"chip{(i + 1) % chips}", **edge} for i in range(chips)
        ]
    else:
        raise ValueError(f"unknown fabric shape {shape!r}; valid: switch, ring")
    return {"directed": False, "multigraph": False, "graph": {}, "nodes": nodes, "edges": edges}


def write_fabric(shape: str, out: Path, chips: int = FABRIC_CHIPS) -> Path:
    """Write the ``shape`` fabric of ``chips`` chips to ``out`` (node-link JSON)."""
    out.write_text(json.dumps(fabric_graph_data(shape, chips)))
    return out
