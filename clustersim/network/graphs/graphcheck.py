"""What a user's fabric graph must say, checked before anything is built from it.

:func:`check_fabric` turns a networkx graph (read by :func:`~.graphio.read_fabric`)
into a :class:`FabricSpec`: plain arrays that :mod:`clustersim.network.graphs.custom`
compiles into a topology. The graph's vocabulary is the one
:func:`~.graphio.fabric_graph` writes:

- node attributes :data:`NODE_ATTRS`: ``kind`` (``chip``, ``switch`` or ``nic``;
  a node with an ``instance`` is a chip, others switches), ``instance`` (chips:
  which instance holds it, ``0..count-1``), ``domain`` (chips: the scale-up domain;
  domains are runs of equally many consecutive instances; without it each instance
  is one), ``x``, ``y``, ``z`` (chips: torus coordinates within the domain, which
  must fill the grid), ``label``;
- edge attributes :data:`EDGE_ATTRS`: ``capacity_Bps`` and ``latency_s``
  (required, positive and finite; a number, or a string with units such as
  ``"100GB/s"`` and ``"1.5us"``), ``lanes`` (a whole number, default 1), ``lanes_up``
  (``0..lanes``, default ``lanes``: fewer is a degraded link, 0 a link down),
  ``kind`` (``neuronlink``, ``switch`` or ``efa``; default ``neuronlink`` between
  two chips, else ``switch``), ``label``.

An undirected graph's edge is a link each way. Every instance must have the
scenario's number of chips, and every chip must reach every other over the links
that are up. Chips keep their order in the file within an instance. Duplicate
edges, self-loops, unknown attribute names (the closest known name is suggested)
and bad values are :class:`~clustersim.errors.ScenarioError` s that name the node
or edge and the attribute.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from clustersim.errors import MISSING, ScenarioError
from clustersim.network.fabric import Int64s
from clustersim.network.graphs.shortest import strongly_connected_to
from clustersim.units import UnitError, parse_bandwidth, parse_duration

if TYPE_CHECKING:
    import networkx as nx

__all__ = [
    "EDGE_ATTRS",
    "GRAPH_ATTRS",
    "LINK_KINDS",
    "NODE_ATTRS",
    "NODE_KINDS",
    "FabricSpec",
    "check_fabric",
]

NODE_ATTRS = ("kind", "instance", "domain", "x", "y", "z", "label")
EDGE_ATTRS = ("capacity_Bps", "latency_s", "lanes", "lanes_up", "kind", "label", "id")
GRAPH_ATTRS = ("name", "label", "description", "node_default", "edge_default")
NODE_KINDS = ("chip", "switch", "nic")
LINK_KINDS = ("neuronlink", "switch", "efa")
AXES = ("x", "y", "z")
MAX_LANES = 1024


@dataclass(frozen=True, eq=False)
class FabricSpec:
    """A checked fabric: nodes (chips first, in chip order) and directed links as arrays."""

    name: str
    labels: list[str]
    kinds: list[str]
    n_chips: int
    domain_instances: int
    coords: Int64s | None
    dims: tuple[int, ...]
    u: Int64s
    v: Int64s
    capacity_Bps: NDArray[np.float64]
    latency_s: NDArray[np.float64]
    lanes: Int64s
    lanes_up: Int64s
    link_kinds: list[str]


def _show(name: object) -> str:
    text = repr(str(name))
    return text if len(text) <= 60 else text[:57] + "...'"


def _unknown(where: str, key: object, known: tuple[str, ...], what: str) -> ScenarioError:
    close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ScenarioError(
        f"{where}.{key}", MISSING, f"unknown {what} attribute; {hint}known: {', '.join(known)}"
    )


def _whole(value: object, where: str, low: int, high: int) -> int:
    number: object = value
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit() and len(value) < 20:
        number = int(value)
    if isinstance(number, float) and math.isfinite(number) and number.is_integer():
        number = int(number)
    if isinstance(number, bool) or not isinstance(number, int):
        raise ScenarioError(where, value, "must be a whole number")
    if not low <= number <= high:
        raise ScenarioError(where, value, f"must be {low}..{high}")
    return number


def _positive(value: object, where: str, parse: Callable[[object], float]) -> float:
    if isinstance(value, str):
        try:
            number = parse(value)
        except UnitError as exc:
            raise ScenarioError(where, value, str(exc)) from None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    else:
        raise ScenarioError(where, value, "must be a number")
    if not (math.isfinite(number) and number > 0):
        raise ScenarioError(where, value, "must be positive and finite")
    return number


def _check_graph_attrs(g: nx.Graph, where: str) -> str:
    for key in g.graph:
        if key not in GRAPH_ATTRS:
            raise _unknown(f"{where}[graph]", key, GRAPH_ATTRS, "graph")
    name = g.graph.get("name", "")
    return str(name)[:80] if name else "custom"


def _node_kind(data: Mapping[str, Any], where: str) -> str:
    kind = data.get("kind", "chip" if "instance" in data else "switch")
    if kind not in NODE_KINDS:
        raise ScenarioError(
            f"{where}.kind", kind, f"unknown node kind; valid: {', '.join(NODE_KINDS)}"
        )
    if kind == "chip" and "instance" not in data:
        raise ScenarioError(f"{where}.instance", MISSING, "a chip needs its instance")
    return str(kind)


def _chips_and_others(
    g: nx.Graph, where: str, chips_per_instance: int, instances: int
) -> tuple[list[Any], list[Any], dict[Any, int]]:
    """Chip nodes in chip order (by instance, then file order), the other nodes, and each
    chip's instance."""
    chips: list[Any] = []
    others: list[Any] = []
    instance_of: dict[Any, int] = {}
    seen: dict[str, Any] = {}
    for node, data in g.nodes(data=True):
        at = f"{where}[node {_show(node)}]"
        if str(node) in seen:
            raise ScenarioError(at, MISSING, f"two nodes are named {_show(node)}")
        seen[str(node)] = node
        for key in data:
            if key not in NODE_ATTRS:
                raise _unknown(at, key, NODE_ATTRS, "node")
        if _node_kind(data, at) != "chip":
            if re.fullmatch(r"chip[0-9]+", str(node)):
                raise ScenarioError(
                    f"{at}.kind", data.get("kind"), "names chipN are kept for chips"
                )
            others.append(node)
            continue
        instance_of[node] = _whole(data["instance"], f"{at}.instance", 0, instances - 1)
        chips.append(node)
    per = np.bincount(
        np.fromiter(instance_of.values(), dtype=np.int64, count=len(chips)), minlength=instances
    )
    wrong = np.flatnonzero(per != chips_per_instance)
    if wrong.size:
        i = int(wrong[0])
        raise ScenarioError(
            f"{where}[instance {i}]",
            MISSING,
            f"has {per[i]} chips; each of the scenario's {instances} instances has "
            f"{chips_per_instance} (chips need an instance attribute 0..{instances - 1})",
        )
    chips.sort(key=instance_of.__getitem__)  # stable: file order within an instance
    for i, chip in enumerate(chips):  # chipN is how reports and injections name chip N
        if re.fullmatch(r"chip[0-9]+", str(chip)) and str(chip) != f"chip{i}":
            raise ScenarioError(
                f"{where}[node {_show(chip)}]",
                MISSING,
                f"is chip {i} in chip order (by instance, then as written): name it chip{i} "
                "or something else than chipN",
            )
    return chips, others, instance_of


def _domains(
    g: nx.Graph, chips: list[Any], instance_of: dict[Any, int], where: str, cpi: int
) -> int:
    """Instances per scale-up domain, from the chips' ``domain`` attributes."""
    given = ["domain" in g.nodes[c] for c in chips]
    if not any(given):
        return 1
    if not all(given):
        missing = chips[given.index(False)]
        raise ScenarioError(
            f"{where}[node {_show(missing)}].domain", MISSING, "give every chip a domain, or none"
        )
    label: dict[int, int] = {}
    domain = []
    for chip in chips:
        raw = _whole(g.nodes[chip]["domain"], f"{where}[node {_show(chip)}].domain", 0, 2**31)
        domain.append(label.setdefault(raw, len(label)))
    instances = len(chips) // cpi
    per = sum(1 for i in range(instances) if domain[i * cpi] == 0)
    if instances % per:
        raise ScenarioError(
            f"{where}[node {_show(chips[0])}].domain",
            MISSING,
            f"domain 0 holds {per} instances, which does not divide the {instances} instances",
        )
    for chip, d in zip(chips, domain, strict=True):
        if d != instance_of[chip] // per:
            raise ScenarioError(
                f"{where}[node {_show(chip)}].domain",
                g.nodes[chip]["domain"],
                f"domains must be runs of {per} consecutive instances (as domain 0 is); "
                f"this chip's instance {instance_of[chip]} is in domain {instance_of[chip] // per}",
            )
    return per


def _coords(
    g: nx.Graph, chips: list[Any], where: str, per_domain: int
) -> tuple[Int64s | None, tuple[int, ...]]:
    axes = [a for a in AXES if any(a in g.nodes[c] for c in chips)]
    if not axes:
        return None, ()
    coords = np.zeros((len(chips), len(axes)), dtype=np.int64)
    for i, chip in enumerate(chips):
        at = f"{where}[node {_show(chip)}]"
        for j, axis in enumerate(axes):
            if axis not in g.nodes[chip]:
                raise ScenarioError(f"{at}.{axis}", MISSING, f"give every chip {', '.join(axes)}")
            coords[i, j] = _whole(g.nodes[chip][axis], f"{at}.{axis}", 0, per_domain - 1)
    dims = tuple(int(d) + 1 for d in coords.max(axis=0))
    if math.prod(dims) != per_domain:
        raise ScenarioError(
            f"{where}[node {_show(chips[0])}].{axes[0]}",
            MISSING,
            f"torus coordinates span {'x'.join(map(str, dims))}, which is not the "
            f"{per_domain} chips of a domain",
        )
    flat = np.ravel_multi_index(coords.T, dims) + np.arange(len(chips)) // per_domain * per_domain
    seen = np.zeros(len(chips), dtype=bool)
    for i, key in enumerate(flat.tolist()):
        if seen[key]:
            raise ScenarioError(
                f"{where}[node {_show(chips[i])}].{axes[0]}",
                MISSING,
                f"two chips of one domain sit at {tuple(coords[i].tolist())}",
            )
        seen[key] = True
    return coords, dims


def _edge_values(data: Mapping[str, Any], at: str, both_chips: bool) -> tuple[Any, ...]:
    for key in data:
        if key not in EDGE_ATTRS:
            raise _unknown(at, key, EDGE_ATTRS, "edge")
    for key in ("capacity_Bps", "latency_s"):
        if key not in data:
            raise ScenarioError(
                f"{at}.{key}", MISSING, "every edge needs capacity_Bps and latency_s"
            )
    cap = _positive(data["capacity_Bps"], f"{at}.capacity_Bps", parse_bandwidth)
    lat = _positive(data["latency_s"], f"{at}.latency_s", parse_duration)
    lanes = _whole(data.get("lanes", 1), f"{at}.lanes", 1, MAX_LANES)
    up = _whole(data.get("lanes_up", lanes), f"{at}.lanes_up", 0, lanes)
    kind = data.get("kind", "neuronlink" if both_chips else "switch")
    if kind not in LINK_KINDS:
        raise ScenarioError(
            f"{at}.kind", kind, f"unknown link kind; valid: {', '.join(LINK_KINDS)}"
        )
    return cap, lat, lanes, up, str(kind)


def _links(
    g: nx.Graph, ids: dict[Any, int], n_chips: int, where: str
) -> tuple[list[tuple[int, int]], list[tuple[Any, ...]]]:
    pairs: list[tuple[int, int]] = []
    values: list[tuple[Any, ...]] = []
    seen: set[tuple[int, int]] = set()
    edges = g.edges(keys=True, data=True) if g.is_multigraph() else g.edges(data=True)
    for edge in edges:
        a, b, data = edge[0], edge[1], edge[-1]
        at = f"{where}[edge {_show(a)} -> {_show(b)}]"
        if a == b:
            raise ScenarioError(at, MISSING, "a self-loop; a chip's own DMA comes from its catalog")
        u, v = ids[a], ids[b]
        both = [(u, v)] if g.is_directed() else [(u, v), (v, u)]
        if any(p in seen for p in both):
            raise ScenarioError(
                at, MISSING, "a duplicate edge; parallel cables are lanes of one edge (lanes: N)"
            )
        found = _edge_values(data, at, u < n_chips and v < n_chips)
        for p in both:
            seen.add(p)
            pairs.append(p)
            values.append(found)
    return pairs, values


def _check_reach(
    n_nodes: int, pairs: Int64s, up: Int64s, *, n_chips: int, labels: list[str], where: str
) -> None:
    live = up > 0
    with_first = strongly_connected_to(n_nodes, pairs[live, 0], pairs[live, 1], 0)
    apart = np.flatnonzero(~with_first[:n_chips])
    if apart.size:
        chip = int(apart[0])
        raise ScenarioError(
            f"{where}[node {_show(labels[chip])}]",
            MISSING,
            f"chips {_show(labels[0])} and {_show(labels[chip])} cannot reach each other both "
            "ways over the links that are up: every chip must reach every other",
        )


def check_fabric(g: nx.Graph, *, chips_per_instance: int, instances: int, where: str) -> FabricSpec:
    """Check ``g`` against a cluster of ``instances`` x ``chips_per_instance`` chips."""
    name = _check_graph_attrs(g, where)
    chips, others, instance_of = _chips_and_others(g, where, chips_per_instance, instances)
    order = chips + others
    ids = {node: i for i, node in enumerate(order)}
    labels = [str(node) for node in order]
    kinds = ["chip"] * len(chips) + [_node_kind(g.nodes[n], "") for n in others]
    per = _domains(g, chips, instance_of, where, chips_per_instance)
    coords, dims = _coords(g, chips, where, per * chips_per_instance)
    pairs, values = _links(g, ids, len(chips), where)
    if not pairs:
        raise ScenarioError(where, MISSING, "the graph has no edges")
    uv = np.asarray(pairs, dtype=np.int64)
    columns = list(zip(*values, strict=True))
    lanes_up = np.asarray(columns[3], dtype=np.int64)
    _check_reach(len(order), uv, lanes_up, n_chips=len(chips), labels=labels, where=where)
    return FabricSpec(
        name=name,
        labels=labels,
        kinds=kinds,
        n_chips=len(chips),
        domain_instances=per,
        coords=coords,
        dims=dims,
        u=uv[:, 0].copy(),
        v=uv[:, 1].copy(),
        capacity_Bps=np.asarray(columns[0], dtype=np.float64),
        latency_s=np.asarray(columns[1], dtype=np.float64),
        lanes=np.asarray(columns[2], dtype=np.int64),
        lanes_up=lanes_up,
        link_kinds=list(columns[4]),
    )
