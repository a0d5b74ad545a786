"""A plain node-link JSON fabric read without networkx, as networkx would read it.

Importing networkx costs a fifth of a second, more than reading a 1,024-chip fabric
file. :func:`plain_graph` builds a :class:`PlainGraph` from node-link JSON that is
plainly a simple graph (``"multigraph": false``, every node an object with a string
or integer ``id``, every edge an object with string or integer ``source`` and
``target``, graph attributes a mapping). It has the part of a ``networkx.Graph``'s
interface that :mod:`.graphcheck` reads (``graph``, ``nodes``, ``edges``,
``is_directed``, ``is_multigraph``, ``number_of_nodes``, ``number_of_edges``), and the
same contents in the same order as ``networkx.node_link_graph`` gives: nodes in the
order they are first named, a node named again or an edge given again updating its
attributes, and edges listed node by node (each undirected edge once, from the node
first met). Anything else returns None and networkx reads it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any

__all__ = ["PlainGraph", "plain_graph"]

Attrs = dict[str, Any]


class _Nodes:
    """``g.nodes``: ``g.nodes[n]`` is a node's attributes, ``g.nodes(data=True)`` lists them."""

    def __init__(self, attrs: dict[Hashable, Attrs]) -> None:
        self._attrs = attrs

    def __getitem__(self, node: Hashable) -> Attrs:
        return self._attrs[node]

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._attrs)

    def __len__(self) -> int:
        return len(self._attrs)

    def __contains__(self, node: object) -> bool:
        return node in self._attrs

    def __call__(self, data: bool = False) -> Iterator[Any]:
        return iter(self._attrs.items()) if data else iter(self._attrs)


class PlainGraph:
    """A simple graph, directed or not, with attribute dicts on its nodes and edges."""

    def __init__(self, *, directed: bool, graph: Attrs) -> None:
        self.graph = graph
        self._directed = directed
        self._node: dict[Hashable, Attrs] = {}
        self._adj: dict[Hashable, dict[Hashable, Attrs]] = {}
        self._n_edges = 0

    @property
    def nodes(self) -> _Nodes:
        return _Nodes(self._node)

    def is_directed(self) -> bool:
        return self._directed

    def is_multigraph(self) -> bool:
        return False

    def number_of_nodes(self) -> int:
        return len(self._node)

    def number_of_edges(self) -> int:
        return self._n_edges

    def add_node(self, node: Hashable, attrs: Attrs) -> None:
        if node not in self._node:
            self._adj[node] = {}
            self._node[node] = {}
        self._node[node].update(attrs)

    def add_edge(self, u: Hashable, v: Hashable, attrs: Attrs) -> None:
        for node in (u, v):
            if node not in self._node:
                self._adj[node] = {}
                self._node[node] = {}
        data = self._adj[u].get(v)
        if data is None:
            data = {}
            self._n_edges += 1
        data.update(attrs)
        self._adj[u][v] = data
        if not self._directed:
            self._adj[v][u] = data

    def edges(self, data: bool = False) -> Iterator[Any]:
        """``(u, v)`` or ``(u, v, attrs)`` per edge, node by node (an undirected edge once)."""
        seen: set[Hashable] = set()
        for u, nbrs in self._adj.items():
            for v, attrs in nbrs.items():
                if self._directed or v not in seen:
                    yield (u, v, attrs) if data else (u, v)
            if not self._directed:
                seen.add(u)


def _name(value: object) -> bool:
    return type(value) is str or type(value) is int


def plain_graph(data: dict[str, Any], edges: str) -> PlainGraph | None:
    """``data`` (node-link JSON whose nodes and ``edges`` are lists of objects) as a
    :class:`PlainGraph`; None where it is not plainly a simple graph."""
    directed = data.get("directed", False)
    attrs = data.get("graph", {})
    if data.get("multigraph", True) is not False or type(directed) is not bool:
        return None
    if type(attrs) is not dict:
        return None
    nodes: list[dict[str, Any]] = data["nodes"]
    links: list[dict[str, Any]] = data.get(edges, [])
    if not all(_name(d.get("id")) for d in nodes):
        return None
    if not all(_name(d.get("source")) and _name(d.get("target")) for d in links):
        return None
    g = PlainGraph(directed=directed, graph=attrs)
    for d in nodes:
        g.add_node(d["id"], {str(k): v for k, v in d.items() if k != "id"})
    for d in links:
        keep = {str(k): v for k, v in d.items() if k not in {"source", "target"}}
        g.add_edge(d["source"], d["target"], keep)
    return g
