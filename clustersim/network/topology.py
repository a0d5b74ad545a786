"""The physical network of a cluster: chips, switches and links, and routes over them.

A :class:`Topology` wraps a ``networkx.DiGraph``. Nodes are chips
(``("chip", i)`` with the global chip index ``i = instance * chips_per_instance
+ local index``), switches (``("switch", instance)``) and the scale-out fabric
(``("efa",)``). Every directed edge is one physical link, numbered in the order
it was added, with the attributes ``link``, ``kind``, ``capacity_Bps``,
``latency_s``, ``lanes``, ``lanes_up`` and ``state``. The solver does not touch
the graph: it reads the numpy arrays :attr:`Topology.capacity_Bps`,
:attr:`Topology.latency_s` and :attr:`Topology.names`, indexed by link.

Each chip also has a ``local`` self-loop link that carries traffic between ranks
on the same chip (intra-chip DMA, ``chip.dma_bw_Bps``, zero latency).

Routes are tuples of link indices. A builder supplies a *preferred path*
function (dimension-order on a torus, up-down through a switch, chip-EFA-chip
between instances); when a link on the preferred path is down, routing falls
back to the lowest-latency path over the links that are still up, and raises
:class:`~clustersim.errors.PartitionError` when there is none. Routes are
cached per topology state; :meth:`Topology.set_lanes_up` changes the state.

Builders are registered by the name used in ``instance.fabric.topology``
(:func:`register_topology`); the shipped ones, and the pieces to compose new
ones from, live in :mod:`clustersim.network.builders`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Literal, TypeAlias

import networkx as nx
import numpy as np
from numpy.typing import NDArray

from clustersim.catalog.schema import ChipSpec, InstanceSpec
from clustersim.errors import PartitionError, ScenarioError, SimulationError

__all__ = [
    "EFA_NODE",
    "Builder",
    "LinkKind",
    "LinkState",
    "Node",
    "PathFn",
    "Topology",
    "build_topology",
    "chip_node",
    "register_topology",
    "topology_names",
]

Node: TypeAlias = tuple[str | int, ...]
"""A graph node: ``("chip", i)``, ``("switch", instance)``, ``("efa",)``, ..."""

LinkState = Literal["up", "down", "degraded"]
LinkKind = Literal["local", "neuronlink", "switch", "efa"]

PathFn: TypeAlias = Callable[[int, int], Sequence[Node]]
"""``(src_chip, dst_chip) -> nodes`` from ``chip_node(src)`` to ``chip_node(dst)``, src != dst."""

Builder: TypeAlias = Callable[[InstanceSpec, ChipSpec, int], "Topology"]

EFA_NODE: Node = ("efa",)


def chip_node(chip: int) -> Node:
    return ("chip", chip)


class Topology:
    """A directed graph of chips, switches and links, with numpy link arrays and cached routes.

    ``path_fn`` gives each chip pair its preferred path; without one, routes are
    lowest-latency paths. Builders add links with :meth:`add_link`.
    """

    def __init__(
        self,
        name: str,
        *,
        chips_per_instance: int,
        instances: int = 1,
        local_bw_Bps: float,
        path_fn: PathFn | None = None,
    ) -> None:
        if chips_per_instance < 1 or instances < 1:
            raise SimulationError(
                f"topology {name!r} needs at least one chip and one instance "
                f"(got {chips_per_instance} chips x {instances} instances)"
            )
        self.name = name
        self.chips_per_instance = chips_per_instance
        self.instances = instances
        self.graph = nx.DiGraph()
        self.path_fn = path_fn
        self.version = 0
        """Incremented whenever link state changes; caches keyed on routes compare it."""
        self._nominal_Bps: list[float] = []
        self._latency_s: list[float] = []
        self._names: list[str] = []
        self._lanes: list[int] = []
        self._lanes_up: list[int] = []
        self._n_down = 0
        self._edges: list[tuple[Node, Node]] = []
        self._edge_link: dict[tuple[Node, Node], int] = {}
        self._routes: dict[tuple[int, int], tuple[int, ...]] = {}
        self._arrays: tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.str_]] | None = (
            None
        )
        self._local: list[int] = []
        self._scaleout: tuple[NDArray[np.int64], NDArray[np.int64]] | None = None
        for chip in range(self.n_chips):
            self.graph.add_node(chip_node(chip), kind="chip", instance=chip // chips_per_instance)
        for chip in range(self.n_chips):
            node = chip_node(chip)
            self._local.append(
                self.add_link(node, node, capacity_Bps=local_bw_Bps, latency_s=0.0, kind="local")
            )

    # -- construction -------------------------------------------------------------------------

    def add_link(
        self,
        u: Node,
        v: Node,
        *,
        capacity_Bps: float,
        latency_s: float,
        lanes: int = 1,
        kind: LinkKind,
    ) -> int:
        """Add one directed link ``u -> v`` and return its index.

        ``capacity_Bps`` is the link's total over its ``lanes`` lanes; losing a lane
        scales it by ``lanes_up / lanes``. A second link between the same nodes is an
        error: model parallel cables as lanes of one link.
        """
        if (u, v) in self._edge_link:
            raise SimulationError(f"topology {self.name!r}: duplicate link {u} -> {v}")
        if not capacity_Bps > 0 or latency_s < 0 or lanes < 1:
            raise SimulationError(
                f"topology {self.name!r}: link {u} -> {v} needs capacity > 0, latency >= 0 and "
                f"lanes >= 1 (got {capacity_Bps}, {latency_s}, {lanes})"
            )
        for node in (u, v):
            if node not in self.graph:
                self.graph.add_node(node, kind=str(node[0]))
        link = len(self._edges)
        self._edges.append((u, v))
        self._edge_link[(u, v)] = link
        self._nominal_Bps.append(float(capacity_Bps))
        self._latency_s.append(float(latency_s))
        self._lanes.append(lanes)
        self._lanes_up.append(lanes)
        self._names.append(
            f"{_node_name(u)}:local" if u == v else f"{_node_name(u)}->{_node_name(v)}"
        )
        self.graph.add_edge(
            u,
            v,
            link=link,
            kind=kind,
            capacity_Bps=float(capacity_Bps),
            latency_s=float(latency_s),
            lanes=lanes,
            lanes_up=lanes,
            state="up",
        )
        self._arrays = None
        self._routes.clear()
        self.version += 1
        return link

    def add_duplex(
        self,
        u: Node,
        v: Node,
        *,
        capacity_Bps: float,
        latency_s: float,
        lanes: int = 1,
        kind: LinkKind,
    ) -> tuple[int, int]:
        """Add ``u -> v`` and ``v -> u`` with the same figures; return both indices."""
        a = self.add_link(
            u, v, capacity_Bps=capacity_Bps, latency_s=latency_s, lanes=lanes, kind=kind
        )
        b = self.add_link(
            v, u, capacity_Bps=capacity_Bps, latency_s=latency_s, lanes=lanes, kind=kind
        )
        return a, b

    # -- sizes and arrays ---------------------------------------------------------------------

    @property
    def n_chips(self) -> int:
        return self.chips_per_instance * self.instances

    @property
    def n_links(self) -> int:
        return len(self._edges)

    def _link_arrays(self) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.str_]]:
        if self._arrays is None:
            nominal = np.asarray(self._nominal_Bps, dtype=np.float64)
            scale = np.asarray(self._lanes_up, dtype=np.float64) / np.asarray(self._lanes)
            self._arrays = (
                nominal * scale,
                np.asarray(self._latency_s, dtype=np.float64),
                np.asarray(self._names, dtype=np.str_),
            )
        return self._arrays

    @property
    def capacity_Bps(self) -> NDArray[np.float64]:
        """Current per-direction capacity of each link (zero when down). Do not modify."""
        return self._link_arrays()[0]

    @property
    def latency_s(self) -> NDArray[np.float64]:
        return self._link_arrays()[1]

    @property
    def names(self) -> NDArray[np.str_]:
        return self._link_arrays()[2]

    def local_link(self, chip: int) -> int:
        return self._local[chip]

    def link(self, u: Node, v: Node) -> int:
        """Index of the link ``u -> v``."""
        try:
            return self._edge_link[(u, v)]
        except KeyError:
            raise SimulationError(f"topology {self.name!r} has no link {u} -> {v}") from None

    def endpoints(self, link: int) -> tuple[Node, Node]:
        return self._edges[link]

    def instance_of(self, chip: int) -> int:
        return chip // self.chips_per_instance

    # -- state ----------------------------------------------------------------------------------

    def state(self, link: int) -> LinkState:
        up, lanes = self._lanes_up[link], self._lanes[link]
        return "down" if up == 0 else ("up" if up == lanes else "degraded")

    def lanes_up(self, link: int) -> int:
        return self._lanes_up[link]

    def set_lanes_up(self, link: int, lanes_up: int) -> None:
        """Set how many lanes of ``link`` work; 0 takes it down. Invalidates cached routes."""
        lanes = self._lanes[link]
        if not 0 <= lanes_up <= lanes:
            raise SimulationError(
                f"link {self._names[link]} has {lanes} lanes (got lanes_up {lanes_up})"
            )
        self._n_down += (lanes_up == 0) - (self._lanes_up[link] == 0)
        self._lanes_up[link] = lanes_up
        u, v = self._edges[link]
        attrs = self.graph.edges[u, v]
        attrs["lanes_up"] = lanes_up
        attrs["state"] = self.state(link)
        attrs["capacity_Bps"] = self._nominal_Bps[link] * lanes_up / lanes
        self._arrays = None
        self._routes.clear()
        self.version += 1

    def set_link_state(self, link: int, state: Literal["up", "down"]) -> None:
        """Take a link fully down, or restore all of its lanes."""
        self.set_lanes_up(link, 0 if state == "down" else self._lanes[link])

    # -- routing --------------------------------------------------------------------------------

    def route(self, src_chip: int, dst_chip: int) -> tuple[int, ...]:
        """Link indices from ``src_chip`` to ``dst_chip``; the chip's local link when equal."""
        key = (src_chip, dst_chip)
        found = self._routes.get(key)
        if found is None:
            found = self._compute_route(src_chip, dst_chip)
            self._routes[key] = found
        return found

    def set_scaleout_links(self, up: Sequence[int], down: Sequence[int]) -> None:
        """Declare each chip's up and down link to a non-blocking scale-out switch.

        While no link is down, :meth:`routes` then resolves every pair of chips in
        different instances to ``(up[src], down[dst])`` in bulk, without caching it:
        an all-to-all over thousands of chips would otherwise fill the route cache
        with millions of two-link routes. The builder's ``path_fn`` must agree.
        """
        if len(up) != self.n_chips or len(down) != self.n_chips:
            raise SimulationError(f"topology {self.name!r}: one up and one down link per chip")
        self._scaleout = (np.asarray(up, dtype=np.int64), np.asarray(down, dtype=np.int64))

    def routes(
        self, pairs: Sequence[tuple[int, int]]
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """The links of the routes of all ``pairs``, concatenated, and each route's latency.

        Both are multisets: the order of the routes is not that of ``pairs``.
        """
        route = self.route
        if self._scaleout is not None and not self._n_down and len(pairs) > 1:
            chips = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
            if chips.min() < 0 or chips.max() >= self.n_chips:
                raise SimulationError(f"topology {self.name!r} has chips 0..{self.n_chips - 1}")
            inst = chips // self.chips_per_instance
            cross = inst[:, 0] != inst[:, 1]
            up, down = self._scaleout
            ups, downs = up[chips[cross, 0]], down[chips[cross, 1]]
            local = [route(int(s), int(d)) for s, d in chips[~cross]]
            flat = np.concatenate(
                [np.fromiter(itertools.chain.from_iterable(local), dtype=np.int64), ups, downs]
            )
            lat = self.latency_s
            latency = np.concatenate([self._latencies(local), lat[ups] + lat[downs]])
            return flat, latency
        found = [route(s, d) for s, d in pairs]
        flat = np.fromiter(itertools.chain.from_iterable(found), dtype=np.int64)
        return flat, self._latencies(found)

    def _latencies(self, routes: list[tuple[int, ...]]) -> NDArray[np.float64]:
        if not routes:
            return np.zeros(0)
        starts = np.zeros(len(routes), dtype=np.int64)
        np.cumsum([len(r) for r in routes[:-1]], out=starts[1:])
        flat = np.fromiter(itertools.chain.from_iterable(routes), dtype=np.int64)
        out: NDArray[np.float64] = np.add.reduceat(self.latency_s[flat], starts)
        return out

    def route_latency_s(self, route: Sequence[int]) -> float:
        lat = self._latency_s
        return float(sum(lat[link] for link in route))

    def _compute_route(self, src: int, dst: int) -> tuple[int, ...]:
        n = self.n_chips
        if not (0 <= src < n and 0 <= dst < n):
            raise SimulationError(
                f"topology {self.name!r} has chips 0..{n - 1} (got {src} -> {dst})"
            )
        if src == dst:
            return (self._local[src],)
        if self.path_fn is not None:
            nodes = self.path_fn(src, dst)
            edge_link = self._edge_link
            links = tuple([edge_link[edge] for edge in itertools.pairwise(nodes)])
            if not self._n_down:
                return links
            lanes_up = self._lanes_up
            if all(lanes_up[link] for link in links):
                return links
        return self._fallback_route(src, dst)

    def _fallback_route(self, src: int, dst: int) -> tuple[int, ...]:
        lanes_up, edge_link = self._lanes_up, self._edge_link

        def usable(u: Node, v: Node) -> bool:
            return u != v and lanes_up[edge_link[(u, v)]] > 0

        view = nx.subgraph_view(self.graph, filter_edge=usable)
        try:
            nodes = nx.shortest_path(view, chip_node(src), chip_node(dst), weight="latency_s")
        except nx.NetworkXNoPath:
            raise PartitionError(
                f"chip {src} cannot reach chip {dst}: the fabric of topology {self.name!r} is cut"
            ) from None
        return tuple(edge_link[(u, v)] for u, v in itertools.pairwise(nodes))


def _node_name(node: Node) -> str:
    return "".join(str(part) for part in node)


# -- registry ---------------------------------------------------------------------------------

_BUILDERS: dict[str, Builder] = {}


def register_topology(name: str) -> Callable[[Builder], Builder]:
    """Register a builder under the name used in ``instance.fabric.topology``."""

    def deco(fn: Builder) -> Builder:
        if name in _BUILDERS:
            raise ValueError(f"topology {name!r} is already registered")
        _BUILDERS[name] = fn
        return fn

    return deco


def topology_names() -> list[str]:
    return sorted(_BUILDERS)


def build_topology(
    instance: InstanceSpec, chip: ChipSpec, count: int, *, path: str = "cluster"
) -> Topology:
    """Build ``count`` instances joined by EFA, with the builder named by ``fabric.topology``.

    ``path`` prefixes the key paths of errors. The UltraServer links between
    instances (``instance.ultraserver``) are not modelled yet: a later builder adds them.
    """
    name = instance.fabric.topology
    builder = _BUILDERS.get(name)
    if builder is None:
        raise ScenarioError(
            f"{path}.instance.fabric.topology",
            name,
            f"unknown topology; valid: {', '.join(topology_names())}",
        )
    if count < 1:
        raise ScenarioError(f"{path}.count", count, "must be at least 1")
    return builder(instance, chip, count)
