"""The graphs layer: the fabric as a networkx graph.

Writing a built topology out and reading a user's in safely (:mod:`.graphio`), what
such a graph must say (:mod:`.graphcheck`), and a checked graph compiled into a
topology (:mod:`.custom`). Over :mod:`~clustersim.network.fabric`. It loads networkx
(and scipy, on a large graph: :mod:`.shortest`), so :mod:`clustersim.network` does not
import it: a run on a built-in fabric never loads them.
"""

from __future__ import annotations

from clustersim.network.graphs.custom import HOP_EPS_S, GraphTopology, load_graph, same_fabric
from clustersim.network.graphs.graphcheck import (
    EDGE_ATTRS,
    GRAPH_ATTRS,
    LINK_KINDS,
    NODE_ATTRS,
    NODE_KINDS,
    FabricSpec,
    check_fabric,
)
from clustersim.network.graphs.graphio import (
    FORMATS,
    MAX_FABRIC_BYTES,
    MAX_GRAPH_LINKS,
    MAX_GRAPH_NODES,
    MAX_XML_DEPTH,
    Format,
    estimate_bytes,
    export_fabric,
    fabric_graph,
    format_of,
    read_fabric,
)

__all__ = [
    "EDGE_ATTRS",
    "FORMATS",
    "GRAPH_ATTRS",
    "HOP_EPS_S",
    "LINK_KINDS",
    "MAX_FABRIC_BYTES",
    "MAX_GRAPH_LINKS",
    "MAX_GRAPH_NODES",
    "MAX_XML_DEPTH",
    "NODE_ATTRS",
    "NODE_KINDS",
    "FabricSpec",
    "Format",
    "GraphTopology",
    "check_fabric",
    "estimate_bytes",
    "export_fabric",
    "fabric_graph",
    "format_of",
    "load_graph",
    "read_fabric",
    "same_fabric",
]
