"""The fabric as a networkx graph: writing a built topology out, and reading a user's in safely.

**The interchange graph** (:func:`fabric_graph`) is a ``networkx.DiGraph`` whose
nodes are named as failure injection names them (``chip3``, ``switch0``,
``leaf2``, ``spine2_5``, ``efa``) and carry:

- ``kind``: ``chip``, ``switch`` or ``nic``;
- chips: ``instance`` and ``domain`` (the scale-up domain), and on a torus
  ``x``, ``y`` (and ``z``), the chip's coordinates within its domain.

Each directed edge is one link, with ``capacity_Bps`` (nominal, the total over
its lanes), ``latency_s``, ``lanes``, ``lanes_up`` and ``kind`` (``neuronlink``,
``switch`` or ``efa``). A chip's ``local`` self-loop (intra-chip DMA) is not
written: it comes from the chip's catalog entry when the graph is read back.
Chips are written in chip order; a reader keeps that order within an instance.

:func:`export_fabric` writes it with networkx's own writers (GraphML, GML or
node-link JSON). A fabric of more than :data:`MAX_GRAPH_LINKS` links is refused
up front with the size the file would have, never written for an hour.

**Reading** (:func:`read_fabric`) is bounded before networkx sees the file: at
most :data:`MAX_FABRIC_BYTES`, UTF-8 text without NUL bytes; GraphML is first
parsed by ``defusedxml`` with DTDs forbidden (so no entity expansion, no external
entity and nothing fetched from the network), then checked for nesting depth
(:data:`MAX_XML_DEPTH`) and element counts; every format is held to
:data:`MAX_GRAPH_NODES` nodes and :data:`MAX_GRAPH_LINKS` links. Each problem is
a :class:`~clustersim.errors.ScenarioError` naming ``where`` (exit 2, one line).
What the graph means is checked by :mod:`clustersim.network.graphs.graphcheck`.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from clustersim.errors import MISSING, ScenarioError
from clustersim.network.fabric import Topology, node_name
from clustersim.network.graphs.plaingraph import plain_graph

if TYPE_CHECKING:
    import networkx as nx

__all__ = [
    "FORMATS",
    "MAX_FABRIC_BYTES",
    "MAX_GRAPH_LINKS",
    "MAX_GRAPH_NODES",
    "MAX_XML_DEPTH",
    "Format",
    "estimate_bytes",
    "export_fabric",
    "fabric_graph",
    "format_of",
    "read_fabric",
]

Format = Literal["graphml", "gml", "json"]
FORMATS: tuple[Format, ...] = ("graphml", "gml", "json")
_SUFFIXES: dict[str, Format] = {".graphml": "graphml", ".xml": "graphml", ".gml": "gml"}
_SUFFIXES[".json"] = "json"

MAX_GRAPH_LINKS = 400_000
"""Most directed links a fabric file may hold, written or read. A 16K-chip Trn2 cluster
on a fat tree has about 150,000; networkx holds each link in a few dicts (~1 KB), so
this bounds reading to well under a GiB and writing to under a minute."""
MAX_GRAPH_NODES = 100_000
MAX_FABRIC_BYTES = 160 * 2**20
"""Largest fabric file read: :data:`MAX_GRAPH_LINKS` links as GraphML, the most verbose
format, take about 130 MiB."""
MAX_XML_DEPTH = 6
"""Element nesting in GraphML: graphml > graph > node/edge > data needs four."""

_BYTES_PER_LINK: dict[Format, int] = {"graphml": 330, "gml": 150, "json": 140}
_BYTES_PER_NODE: dict[Format, int] = {"graphml": 250, "gml": 90, "json": 90}
"""Measured on the shipped fabrics (GraphML: 5 data elements per edge), rounded up."""


# -- export ---------------------------------------------------------------------------------


def _node_labels(topo: Topology) -> list[str]:
    labels = getattr(topo, "labels", None)
    if isinstance(labels, list) and len(labels) == topo.n_nodes:
        return [str(label) for label in labels]
    return [node_name(topo.node(i)) for i in range(topo.n_nodes)]


def _node_kind(topo: Topology, i: int) -> str:
    kinds = getattr(topo, "node_kinds", None)
    if isinstance(kinds, list) and len(kinds) == topo.n_nodes:
        return str(kinds[i])
    if i < topo.n_chips:
        return "chip"
    return "nic" if str(topo.node(i)[0]) == "nic" else "switch"


def fabric_graph(topo: Topology) -> nx.DiGraph:
    import networkx as nx

    """The interchange graph of ``topo`` (module docstring); refused above the size limits."""
    _check_size(topo, "graphml", "--out")
    g = nx.DiGraph(name=topo.name)
    labels = _node_labels(topo)
    coords = topo.chip_coords
    axes = ("x", "y", "z")[: coords.shape[1]] if coords is not None else ()
    for i in range(topo.n_nodes):
        attrs: dict[str, Any] = {"kind": _node_kind(topo, i)}
        if i < topo.n_chips:
            attrs["instance"] = topo.instance_of(i)
            attrs["domain"] = int(topo.chip_domain[i])
            if coords is not None:
                attrs.update((axis, int(c)) for axis, c in zip(axes, coords[i], strict=False))
        g.add_node(labels[i], **attrs)
    u, v = topo.link_u, topo.link_v
    nominal, latency, kinds = topo.nominal_Bps, topo.latency_s, topo.kinds
    for link in range(topo.n_links):
        a, b = int(u[link]), int(v[link])
        if a == b:  # the chip's local link: rebuilt from its catalog entry on import
            continue
        g.add_edge(
            labels[a],
            labels[b],
            capacity_Bps=float(nominal[link]),
            latency_s=float(latency[link]),
            lanes=topo.lanes(link),
            lanes_up=topo.lanes_up(link),
            kind=str(kinds[link]),
        )
    return g


def estimate_bytes(n_nodes: int, n_links: int, fmt: Format) -> int:
    """About how large a fabric file of ``n_nodes`` and ``n_links`` is in format ``fmt``."""
    return n_nodes * _BYTES_PER_NODE[fmt] + n_links * _BYTES_PER_LINK[fmt]


def _check_size(topo: Topology, fmt: Format, where: str) -> None:
    links = topo.n_links - topo.n_chips  # without the local links
    if links > MAX_GRAPH_LINKS or topo.n_nodes > MAX_GRAPH_NODES:
        size = estimate_bytes(topo.n_nodes, links, fmt)
        raise ScenarioError(
            where,
            MISSING,
            f"fabric {topo.name!r} has {topo.n_nodes:,} nodes and {links:,} links: its {fmt} "
            f"file would take about {size / 2**20:,.0f} MiB; fabric files hold at most "
            f"{MAX_GRAPH_NODES:,} nodes and {MAX_GRAPH_LINKS:,} links (export fewer instances)",
        )


def format_of(path: Path, fmt: str | None, where: str) -> Format:
    """``fmt`` if given, else the format named by ``path``'s suffix."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise ScenarioError(where, fmt, f"unknown format; valid: {', '.join(FORMATS)}")
        return fmt
    found = _SUFFIXES.get(path.suffix.lower())
    if found is None:
        raise ScenarioError(
            where,
            str(path),
            f"cannot tell the format from the suffix; use {', '.join(sorted(_SUFFIXES))}",
        )
    return found


def export_fabric(topo: Topology, out: Path, fmt: Format) -> nx.DiGraph:
    import networkx as nx

    """Write ``topo``'s interchange graph to ``out`` in ``fmt``, atomically; return the graph."""
    _check_size(topo, fmt, "--out")
    g = fabric_graph(topo)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        if fmt == "graphml":
            nx.write_graphml(g, tmp)
        elif fmt == "gml":
            nx.write_gml(g, tmp)
        else:
            with tmp.open("w", encoding="utf-8") as f:
                json.dump(nx.node_link_data(g, edges="edges"), f, allow_nan=False)
                f.write("\n")
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return g


# -- reading ------------------------------------------------------------------------------


def read_fabric(path: Path, where: str, fmt: Format | None = None) -> nx.Graph:
    """The graph in ``path``, read within the bounds of the module docstring.

    The format is ``fmt`` or follows the suffix. Errors are ScenarioErrors at ``where``.
    """
    text = _read_text(path, where)
    kind = format_of(path, fmt, where)
    readers: dict[Format, Callable[[str, str], nx.Graph]] = {
        "graphml": _parse_graphml,
        "gml": _parse_gml,
        "json": _parse_json,
    }
    try:
        g = readers[kind](text, where)
    except ScenarioError:
        raise
    except RecursionError:
        raise ScenarioError(where, str(path), f"not a {kind} fabric: nested too deeply") from None
    except Exception as exc:
        if not _malformed(exc):
            raise
        detail = " ".join(str(exc).split())[:160] or type(exc).__name__
        raise ScenarioError(where, str(path), f"not a {kind} fabric: {detail}") from None
    if g.number_of_nodes() > MAX_GRAPH_NODES or g.number_of_edges() > MAX_GRAPH_LINKS:
        raise ScenarioError(where, str(path), _too_many(g.number_of_nodes(), g.number_of_edges()))
    return g


def _malformed(exc: Exception) -> bool:
    """Whether a reader's exception says the file is malformed (not a bug of ours)."""
    if isinstance(exc, ValueError | KeyError | TypeError | IndexError | AttributeError):
        return True
    nx = sys.modules.get("networkx")  # only its readers raise its errors
    return nx is not None and isinstance(exc, nx.NetworkXError)


def _too_many(nodes: int, links: int) -> str:
    return (
        f"{nodes:,} nodes and {links:,} edges: fabric files hold at most "
        f"{MAX_GRAPH_NODES:,} nodes and {MAX_GRAPH_LINKS:,} links"
    )


def _read_text(path: Path, where: str) -> str:
    try:
        if not path.is_file():
            problem = "no such file" if not path.exists() else "not a regular file"
            raise ScenarioError(where, str(path), problem)
        with path.open("rb") as f:
            raw = f.read(MAX_FABRIC_BYTES + 1)
    except OSError as exc:
        raise ScenarioError(where, str(path), f"cannot read: {exc.strerror}") from None
    if len(raw) > MAX_FABRIC_BYTES:
        raise ScenarioError(where, str(path), f"larger than {MAX_FABRIC_BYTES // 2**20} MiB")
    nul = raw.find(b"\0")
    if nul >= 0:
        raise ScenarioError(where, str(path), f"binary data, not a text file (NUL at byte {nul})")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        problem = f"not UTF-8 text (invalid byte {raw[exc.start]:#04x} at byte {exc.start})"
        raise ScenarioError(where, str(path), problem) from None


def _parse_graphml(text: str, where: str) -> nx.Graph:
    import xml.etree.ElementTree as ET

    import defusedxml
    import defusedxml.ElementTree as SafeET
    import networkx as nx

    try:
        root = SafeET.fromstring(text, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except defusedxml.DTDForbidden:
        raise ScenarioError(where, MISSING, "GraphML with a DTD is refused (entities)") from None
    except (defusedxml.EntitiesForbidden, defusedxml.ExternalReferenceForbidden):
        raise ScenarioError(where, MISSING, "GraphML with entities is refused") from None
    except ET.ParseError as exc:
        raise ScenarioError(where, MISSING, f"not well-formed XML ({exc})") from None
    nodes = links = 0
    stack = [(root, 1)]
    while stack:
        element, depth = stack.pop()
        if depth > MAX_XML_DEPTH:
            raise ScenarioError(where, MISSING, f"XML nested deeper than {MAX_XML_DEPTH} levels")
        tag = element.tag.rsplit("}", 1)[-1] if isinstance(element.tag, str) else ""
        nodes += tag == "node"
        links += tag == "edge"
        if nodes > MAX_GRAPH_NODES or links > MAX_GRAPH_LINKS:
            raise ScenarioError(where, MISSING, _too_many(nodes, links))
        stack.extend((child, depth + 1) for child in element)
    if root.tag.rsplit("}", 1)[-1] != "graphml":
        raise ScenarioError(where, MISSING, f"not GraphML: the root element is <{root.tag}>")
    # The text has no DTD, so the standard-library parser networkx uses cannot expand
    # or fetch anything either.
    g: nx.Graph = nx.parse_graphml(text)
    return g


def _parse_gml(text: str, where: str) -> nx.Graph:
    import networkx as nx

    depth = 0
    # GML nests with brackets; strings (double-quoted) may hold brackets of their own.
    for match in re.finditer(r"[\[\]]", re.sub(r'"[^"]*"', "", text)):
        depth += 1 if match.group() == "[" else -1
        if depth > MAX_XML_DEPTH:
            raise ScenarioError(where, MISSING, f"GML nested deeper than {MAX_XML_DEPTH} levels")
    g: nx.Graph = nx.parse_gml(text, label=None)
    names = {n: data.pop("label", n) for n, data in g.nodes(data=True)}
    if len(set(map(str, names.values()))) < len(names):
        raise ScenarioError(where, MISSING, "two GML nodes have the same label")
    return nx.relabel_nodes(g, {n: str(name) for n, name in names.items()}, copy=True)


def _parse_json(text: str, where: str) -> nx.Graph:
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise ScenarioError(where, MISSING, "not node-link JSON: expected an object with 'nodes'")
    edges = "edges" if "edges" in data or "links" not in data else "links"
    if not isinstance(data.get(edges, []), list):
        raise ScenarioError(where, MISSING, f"not node-link JSON: {edges!r} must be a list")
    if len(data["nodes"]) > MAX_GRAPH_NODES or len(data.get(edges, [])) > MAX_GRAPH_LINKS:
        raise ScenarioError(where, MISSING, _too_many(len(data["nodes"]), len(data[edges])))
    for item in (*data["nodes"], *data.get(edges, [])):
        if not isinstance(item, dict):
            raise ScenarioError(where, item, "not node-link JSON: nodes and edges are objects")
    g: nx.Graph = plain_graph(data, edges)
    if g is None:  # not plainly a simple graph: networkx reads it
        import networkx as nx

        g = nx.node_link_graph(data, edges=edges)
    listed = data.get(edges, [])
    if not g.is_multigraph() and g.number_of_edges() < len(listed):
        seen: set[Any] = set()
        for item in listed:  # networkx keeps the last of duplicates: name the first
            a, b = item.get("source"), item.get("target")
            pair = (a, b) if g.is_directed() else frozenset((str(a), str(b)))
            if pair in seen:
                raise ScenarioError(
                    f"{where}[edge {str(a)[:60]!r} -> {str(b)[:60]!r}]",
                    MISSING,
                    "a duplicate edge; parallel cables are lanes of one edge (lanes: N)",
                )
            seen.add(pair)
    return g
