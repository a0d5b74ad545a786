"""The physical network of a cluster: chips, switches and links, and routes over them.

A :class:`Topology` keeps its links in numpy columns, so that building an
UltraCluster of 10^5 chips and 10^6 links costs a few bulk array operations.
Nodes are chips (``("chip", i)`` with the global chip index ``i = instance *
chips_per_instance + local index``; node id ``i``), switches (``("switch",
instance)``, ``("leaf", i)``, ``("spine", tier, i)``, ...) and the non-blocking
scale-out switch ``("efa",)``. Every directed link has a capacity (its total
over ``lanes`` parallel lanes), a latency, a kind and a count of working lanes.
The solver reads the numpy arrays :attr:`Topology.capacity_Bps` (current
capacity: nominal x lanes up / lanes, zero when down) and
:attr:`Topology.latency_s`, indexed by link. :attr:`Topology.graph` is a
``networkx`` view built on first use, for inspection.

Each chip also has a ``local`` self-loop link that carries traffic between ranks
on the same chip: intra-chip DMA, which reads and writes the chip's HBM, so its
capacity is the smaller of the DMA engines' throughput and half the HBM's
sustained bandwidth, and its latency is a DMA transfer's set-up
(:func:`local_path`).

**Domains.** Chips are grouped into scale-up domains of ``domain_instances``
consecutive instances (one instance, or an UltraServer). Inside a domain a
builder's *path function* gives each chip pair its preferred path
(dimension-order on a torus, up-down through a switch tier). Between domains a
:class:`~.scaleout.ScaleOut` fabric routes pairs in bulk (vectorised, and not
cached: an all-to-all over thousands of chips would otherwise fill the cache with
millions of routes). When a link on the preferred path is down, the scale-out fabric first
tries its other equal-cost paths (ECMP), then routing falls back to the
lowest-latency path over the links that are still up (scipy's Dijkstra), and
raises :class:`~clustersim.errors.PartitionError` when there is none, naming the
chips and the down links on their preferred route. A degraded link (some lanes
down) keeps its routes and only loses capacity.

Routes are cached per topology :attr:`~Topology.version`, which every change of
links or lanes increments; listeners (:meth:`Topology.add_listener`, e.g. a
:class:`~clustersim.network.flows.FlowNetwork`) are told of every change.

Builders and scale-out fabrics are registered by name in
:mod:`clustersim.network.registry`, whose :func:`~clustersim.network.registry.build_topology`
builds a cluster's topology.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
from numpy.typing import ArrayLike, NDArray

from clustersim.catalog.schema import ChipSpec
from clustersim.errors import PartitionError, SimulationError
from clustersim.network.links import Int64s, LinkKind, LinkState, LinkTable, Node
from clustersim.network.scaleout import ScaleOut

if TYPE_CHECKING:  # scipy and networkx load on first use: a collective needs neither
    import networkx as nx
    import scipy.sparse as sp

    from clustersim.network.domainpaths import LocalPaths

__all__ = [
    "EFA_NODE",
    "Int64s",
    "LinkKind",
    "LinkState",
    "Node",
    "PathFn",
    "ScaleOut",
    "Topology",
    "chip_node",
    "ecmp_hash",
    "local_path",
]

PathFn: TypeAlias = Callable[[int, int], Sequence[int]]
"""``(src_chip, dst_chip) -> node ids`` from ``src_chip`` to ``dst_chip`` (chip node id =
chip index), for two distinct chips of one domain (of any domains when the topology has
no scale-out fabric)."""

EFA_NODE: Node = ("efa",)

_HOP_EPS_S = 1e-12
"""Added to each link's latency for fallback routing: ties go to fewer hops, and
zero-latency links stay edges of the sparse graph."""


def chip_node(chip: int) -> Node:
    return ("chip", chip)


def local_path(chip: ChipSpec) -> tuple[float, float]:
    """Capacity (B/s) and latency (s) of the intra-chip path between two ranks of ``chip``.

    A transfer between cores of one chip is a DMA copy from HBM to HBM: every byte is
    read once and written once, so it gets at most half of the HBM's sustained
    bandwidth, and never more than the DMA engines move. Each transfer pays the DMA
    set-up (``chip.dma_setup_s``).
    """
    hbm = chip.hbm_bw_Bps * chip.calibration.hbm_efficiency / 2
    return min(chip.dma_bw_Bps, hbm), chip.dma_setup_s


def ecmp_hash(a: ArrayLike, b: ArrayLike) -> Int64s:
    """A deterministic, well-mixed non-negative hash of integer pairs (splitmix64 finaliser)."""
    x = (np.asarray(a, dtype=np.int64).astype(np.uint64) << np.uint64(32)) ^ np.asarray(
        b, dtype=np.int64
    ).astype(np.uint64)
    with np.errstate(over="ignore"):  # arithmetic modulo 2**64 is the point
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    out: Int64s = (x >> np.uint64(2)).astype(np.int64)
    return out


def _row_sums(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """``values.sum(axis=1)`` of a matrix of a few columns (a path's links), bit for bit.

    Below 8 columns numpy adds a row's values left to right, as the loop over
    columns here does; the loop avoids numpy's per-row reduction, which costs
    more than the additions.
    """
    if not 0 < values.shape[1] < 8:
        out: NDArray[np.float64] = values.sum(axis=1)
        return out
    total = values[:, 0].copy()
    for column in range(1, values.shape[1]):
        total += values[:, column]
    return total


class Topology(LinkTable):
    """Chips in scale-up domains, switches and links, with cached routes.

    ``domain_instances`` consecutive instances form one scale-up domain. ``path_fn``
    gives each chip pair of a domain its preferred path; without one, routes are
    lowest-latency paths. Builders add links with :meth:`add_link` or, in bulk,
    :meth:`add_links`, and set :attr:`scaleout` (or let :func:`build_topology` do it).
    """

    max_cached_routes: int = 1 << 20
    max_cached_sources: int = 256

    def __init__(
        self,
        name: str,
        *,
        chips_per_instance: int,
        instances: int = 1,
        local_bw_Bps: float,
        local_latency_s: float = 0.0,
        path_fn: PathFn | None = None,
        domain_instances: int = 1,
    ) -> None:
        if chips_per_instance < 1 or instances < 1 or domain_instances < 1:
            raise SimulationError(
                f"topology {name!r} needs at least one chip, instance and instance per domain "
                f"(got {chips_per_instance} chips x {instances} instances, "
                f"{domain_instances} per domain)"
            )
        if instances % domain_instances:
            raise SimulationError(
                f"topology {name!r}: {instances} instances do not fill domains of "
                f"{domain_instances}"
            )
        self.chips_per_instance = chips_per_instance
        self.instances = instances
        self.domain_instances = domain_instances
        self.path_fn = path_fn
        self.local_paths: LocalPaths | None = None
        """``path_fn`` as one table, when every domain is the same torus (set by builders)."""
        self.scaleout: ScaleOut | None = None
        self._routes: dict[tuple[int, int], tuple[int, ...]] = {}
        self._pred: dict[int, NDArray[np.int32]] = {}
        self._usable_csr: sp.csr_matrix | None = None
        self._graph: nx.DiGraph | None = None
        n = chips_per_instance * instances
        # chip_node(0), chip_node(1), ...: zip makes the tuples without a Python call each.
        super().__init__(name, list(zip(itertools.repeat("chip"), range(n))))
        self.chip_domain: Int64s = np.arange(n, dtype=np.int64) // (
            chips_per_instance * domain_instances
        )
        """Scale-up domain of each chip."""
        self.chip_coords: Int64s | None = None
        """Torus coordinates of each chip within its domain (``n_chips x rank``), if a torus."""
        self.torus_dims: tuple[int, ...] = ()
        chips = np.arange(n, dtype=np.int64)
        self.local_links: Int64s = self.add_links(
            chips, chips, capacity_Bps=local_bw_Bps, latency_s=local_latency_s, kind="local"
        )
        """Each chip's ``local`` self-loop link: the route of a chip to itself."""

    def set_chip_coords(self, coords: ArrayLike, dims: Sequence[int]) -> None:
        """Record each chip's torus coordinates within its domain, and the torus size."""
        arr = np.asarray(coords, dtype=np.int64)
        if arr.shape != (self.n_chips, len(dims)):
            raise SimulationError(f"topology {self.name!r}: coords must be n_chips x {len(dims)}")
        self.chip_coords = arr
        self.torus_dims = tuple(int(d) for d in dims)
        self._graph = None

    @property
    def n_chips(self) -> int:
        return self.chips_per_instance * self.instances

    @property
    def n_domains(self) -> int:
        return self.instances // self.domain_instances

    @property
    def chips_per_domain(self) -> int:
        return self.chips_per_instance * self.domain_instances

    def local_link(self, chip: int) -> int:
        return int(self.local_links[chip])

    def instance_of(self, chip: int) -> int:
        return chip // self.chips_per_instance

    def domain_of(self, chip: int) -> int:
        return chip // self.chips_per_domain

    def add_nodes(self, nodes: Iterable[Node]) -> Int64s:
        ids = super().add_nodes(nodes)
        self._graph = None
        return ids

    def _changed(self) -> None:
        self._routes.clear()
        self._pred.clear()
        self._usable_csr = None
        if self._graph is not None and self._graph.number_of_edges() != self.n_links:
            self._graph = None
        super()._changed()

    def _state_changed(self, link: int) -> None:
        if self._graph is not None:
            attrs = self._graph.edges[self.endpoints(link)]
            attrs.update(
                lanes_up=self.lanes_up(link),
                state=self.state(link),
                capacity_Bps=float(self.capacity_Bps[link]),
            )

    # -- routing --------------------------------------------------------------------------------

    def route(self, src_chip: int, dst_chip: int) -> tuple[int, ...]:
        """Link indices from ``src_chip`` to ``dst_chip``; the chip's local link when equal."""
        key = (src_chip, dst_chip)
        found = self._routes.get(key)
        if found is None:
            found = self._compute_route(src_chip, dst_chip)
            if len(self._routes) >= self.max_cached_routes:
                self._routes.clear()
            self._routes[key] = found
        return found

    def routes(
        self, pairs: Sequence[tuple[int, int]] | NDArray[np.int64]
    ) -> tuple[Int64s, NDArray[np.float64]]:
        """The links of the routes of all ``pairs``, concatenated, and each route's latency.

        Both are multisets: the order of the routes is not that of ``pairs``. Pairs
        in different domains are routed in bulk by the scale-out fabric.
        """
        chips = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        return self.routes_between(chips[:, 0], chips[:, 1])

    def routes_between(self, src: ArrayLike, dst: ArrayLike) -> tuple[Int64s, NDArray[np.float64]]:
        """:meth:`routes` of the pairs ``(src[i], dst[i])``, given as two arrays of chips:
        one path per pair (the first of a chip's NIC ports)."""
        flat, _, latency = self._routes_between(src, dst, 1)
        return flat, latency

    def weighted_routes(
        self, src: ArrayLike, dst: ArrayLike, times: Int64s | None = None
    ) -> tuple[Int64s, NDArray[np.float64] | None, NDArray[np.float64]]:
        """Links, their weights and route latencies of the pairs ``(src[i], dst[i])``, with
        each pair between domains spread over its chip's NIC ports
        (:attr:`~.scaleout.ScaleOut.spread`): ``weights[j]`` is the share of the pair's
        flow on entry ``j`` of the links (None when every share is 1). Pair ``i`` may stand
        for ``times[i]`` flows (default 1), which multiply its entries' weights. The
        latencies are a multiset with one entry per path."""
        spread = self.scaleout.spread if self.scaleout is not None else 1
        return self._routes_between(src, dst, spread, times)

    def _routes_between(
        self, src: ArrayLike, dst: ArrayLike, spread: int, times: Int64s | None = None
    ) -> tuple[Int64s, NDArray[np.float64] | None, NDArray[np.float64]]:
        sources = np.asarray(src, dtype=np.int64).reshape(-1)
        targets = np.asarray(dst, dtype=np.int64).reshape(-1)
        if sources.size != targets.size:
            raise SimulationError(
                f"routes need as many sources as targets ({sources.size} != {targets.size})"
            )
        if not sources.size:
            return np.zeros(0, dtype=np.int64), None, np.zeros(0)
        if (
            min(sources.min(), targets.min()) < 0
            or max(sources.max(), targets.max()) >= self.n_chips
        ):
            raise SimulationError(f"topology {self.name!r} has chips 0..{self.n_chips - 1}")
        scaleout = self.scaleout
        cross = (
            self.chip_domain[sources] != self.chip_domain[targets]
            if scaleout is not None
            else np.zeros(sources.size, dtype=bool)
        )
        n_cross = int(np.count_nonzero(cross))
        t_parts: list[Int64s] = [np.zeros(0, dtype=np.int64)]  # each entry's times
        if n_cross == sources.size:
            flat_parts, lat_parts = [np.zeros(0, dtype=np.int64)], [np.zeros(0)]
        elif self.local_paths is not None and not self.links_down:
            inside = ~cross
            flat, latency, hops = self._bulk_domain_routes(sources[inside], targets[inside])
            flat_parts, lat_parts = [flat], [latency]
            if times is not None:  # the paths' links, then the local links of chips to themselves
                t, moving = times[inside], hops > 0
                t_parts = [np.repeat(t[moving], hops[moving]), t[~moving]]
        else:
            inside = ~cross
            single = self._domain_routes(sources[inside], targets[inside])
            flat_parts = [np.fromiter(itertools.chain.from_iterable(single), dtype=np.int64)]
            lat_parts = [self._latencies(single)]
            if times is not None:
                t_parts = [np.repeat(times[inside], [len(r) for r in single])]
        n_inside = flat_parts[0].size
        if scaleout is not None and n_cross:
            # Every pair crosses domains in a data-parallel step: no need to gather them.
            whole = n_cross == sources.size
            s, d = (sources, targets) if whole else (sources[cross], targets[cross])
            t = times if times is None or whole else times[cross]
            offset = None
            if spread > 1:
                offset = np.tile(np.arange(spread, dtype=np.int64), s.size)
                s, d = np.repeat(s, spread), np.repeat(d, spread)
                t = None if t is None else np.repeat(t, spread)
            matrix, ok = scaleout.paths(s, d, self._usable(), offset)
            if not ok.all():
                route = self.route
                detour = [
                    route(a, b) for a, b in zip(s[~ok].tolist(), d[~ok].tolist(), strict=True)
                ]
                flat_parts.append(np.fromiter(itertools.chain.from_iterable(detour), np.int64))
                lat_parts.append(self._latencies(detour))
                if t is not None:
                    t_parts.append(np.repeat(t[~ok], [len(r) for r in detour]))
                    t = t[ok]
                matrix = matrix[ok]
            real = matrix >= 0
            if real.all():  # paths of one length (a single tier, or pairs that turn alike)
                flat_parts.append(matrix.reshape(-1))
                lat_parts.append(_row_sums(self.latency_s[matrix]))
            else:
                flat_parts.append(matrix[real])
                lat_parts.append(_row_sums(np.where(real, self.latency_s[matrix], 0.0)))
            if t is not None:
                t_parts.append(np.broadcast_to(t[:, None], matrix.shape)[real])
        flat = np.concatenate(flat_parts)
        weights = None if times is None else np.concatenate(t_parts).astype(np.float64)
        if spread > 1 and n_cross:
            # Entries of pairs inside domains come first (weight 1), then the spread paths.
            if weights is None:
                weights = np.full(flat.size, 1.0 / spread)
                weights[:n_inside] = 1.0
            else:
                weights[n_inside:] *= 1.0 / spread
        return flat, weights, np.concatenate(lat_parts)

    def _domain_routes(self, src: Int64s, dst: Int64s) -> list[tuple[int, ...]]:
        """:meth:`route` of each pair ``(src[i], dst[i])`` within one domain, in bulk.

        Pairs not cached yet take their preferred paths from ``path_fn`` and are
        turned into links by one vectorised lookup, instead of one per pair.
        """
        cache = self._routes
        pairs = list(zip(src.tolist(), dst.tolist(), strict=True))
        path_fn = self.path_fn
        bulk = (
            sorted({pair for pair in pairs if pair[0] != pair[1] and pair not in cache})
            if path_fn is not None
            else []
        )
        if path_fn is not None and len(bulk) > 1:
            nodes = [path_fn(s, d) for s, d in bulk]
            hops = np.fromiter((len(n) - 1 for n in nodes), dtype=np.int64, count=len(nodes))
            flat = np.fromiter(itertools.chain.from_iterable(nodes), dtype=np.int64)
            ends = np.cumsum(hops + 1)
            is_last = np.zeros(flat.size, dtype=bool)
            is_last[ends - 1] = True
            links = self.links_between(flat[:-1][~is_last[:-1]], flat[1:][~is_last[:-1]])
            usable = self._usable()
            bounds = np.cumsum(hops)[:-1].tolist()
            if len(cache) + len(bulk) >= self.max_cached_routes:
                cache.clear()
            for pair, found in zip(bulk, np.split(links, bounds), strict=True):
                if usable is None or usable[found].all():
                    cache[pair] = tuple(found.tolist())
        return [cache.get(pair) or self.route(*pair) for pair in pairs]

    def _bulk_domain_routes(
        self, src: Int64s, dst: Int64s
    ) -> tuple[Int64s, NDArray[np.float64], Int64s]:
        """The links of the routes of pairs inside domains, each route's latency and its
        number of links (0: a chip to itself, whose local link is listed after every other
        path's), from :attr:`local_paths` with every link up: what :meth:`route` gives each
        pair, without a Python call per pair."""
        assert self.local_paths is not None
        links, hops = self.local_paths.links(src, dst, self.links_between, self.n_domains)
        moving = hops > 0
        latency = np.zeros(0)
        if links.size:
            starts = np.zeros(int(moving.sum()), dtype=np.int64)
            np.cumsum(hops[moving][:-1], out=starts[1:])
            latency = np.add.reduceat(self.latency_s[links], starts)
        if moving.all():
            return links, latency, hops
        local = self.local_links[src[~moving]]
        links = np.concatenate([links, local])
        return links, np.concatenate([latency, self.latency_s[local]]), hops

    def _latencies(self, routes: list[tuple[int, ...]]) -> NDArray[np.float64]:
        if not routes:
            return np.zeros(0)
        starts = np.zeros(len(routes), dtype=np.int64)
        np.cumsum([len(r) for r in routes[:-1]], out=starts[1:])
        flat = np.fromiter(itertools.chain.from_iterable(routes), dtype=np.int64)
        out: NDArray[np.float64] = np.add.reduceat(self.latency_s[flat], starts)
        return out

    def route_latency_s(self, route: Sequence[int]) -> float:
        return float(self.latency_s[np.asarray(route, dtype=np.int64)].sum())

    def preferred_route(self, src: int, dst: int) -> tuple[int, ...] | None:
        """The route ``src -> dst`` with every link up (None if the builder gives none)."""
        if src == dst:
            return (self.local_link(src),)
        if self.chip_domain[src] != self.chip_domain[dst]:
            if self.scaleout is None:
                return None
            matrix, _ = self.scaleout.paths(np.asarray([src]), np.asarray([dst]), None)
            return tuple(int(x) for x in matrix[0] if x >= 0)
        if self.path_fn is None:
            return None
        nodes = np.asarray(self.path_fn(src, dst), dtype=np.int64)
        return tuple(int(x) for x in self.links_between(nodes[:-1], nodes[1:]))

    def _compute_route(self, src: int, dst: int) -> tuple[int, ...]:
        n = self.n_chips
        if not (0 <= src < n and 0 <= dst < n):
            raise SimulationError(
                f"topology {self.name!r} has chips 0..{n - 1} (got {src} -> {dst})"
            )
        if src == dst:
            return (self.local_link(src),)
        usable = self._usable()
        if self.scaleout is not None and self.chip_domain[src] != self.chip_domain[dst]:
            matrix, ok = self.scaleout.paths(np.asarray([src]), np.asarray([dst]), usable)
            if ok[0]:
                return tuple(int(x) for x in matrix[0] if x >= 0)
        elif self.path_fn is not None:
            links = self.preferred_route(src, dst)
            if links is not None and (usable is None or usable[list(links)].all()):
                return links
        return self._fallback_route(src, dst)

    def _fallback_route(self, src: int, dst: int) -> tuple[int, ...]:
        """Lowest-latency route over the links that are up (Dijkstra, per source, cached)."""
        pred = self._pred.get(src)
        if pred is None:
            import scipy.sparse as sp
            from scipy.sparse.csgraph import dijkstra

            if self._usable_csr is None:
                keep = (self._lanes_up.view > 0) & (self._u.view != self._v.view)
                n = self.n_nodes
                self._usable_csr = sp.csr_matrix(
                    (self.latency_s[keep] + _HOP_EPS_S, (self._u.view[keep], self._v.view[keep])),
                    shape=(n, n),
                )
            _, pred_all = dijkstra(
                self._usable_csr,
                directed=True,
                indices=np.asarray([src]),
                return_predecessors=True,
            )
            pred = pred_all[0].astype(np.int32)
            if len(self._pred) >= self.max_cached_sources:
                self._pred.clear()
            self._pred[src] = pred
        if pred[dst] < 0:
            raise PartitionError(self._cut_message(src, dst))
        nodes = [dst]
        while nodes[-1] != src:
            nodes.append(int(pred[nodes[-1]]))
        path = np.asarray(nodes[::-1], dtype=np.int64)
        return tuple(int(x) for x in self.links_between(path[:-1], path[1:]))

    def _cut_message(self, src: int, dst: int) -> str:
        down_all = np.flatnonzero(self._lanes_up.view == 0)
        try:
            preferred = self.preferred_route(src, dst)
        except SimulationError:
            preferred = None
        cut = [link for link in preferred or () if self._lanes_up.view[link] == 0]
        shown = cut or down_all[:4].tolist()
        what = "down on its route" if cut else "down"
        names = ", ".join(self.link_name(int(link)) for link in shown)
        return (
            f"chip {src} cannot reach chip {dst}: the fabric of topology {self.name!r} is cut "
            f"({what}: {names or 'none'}; {down_all.size} links down in all)"
        )

    # -- networkx view --------------------------------------------------------------------------

    @property
    def graph(self) -> nx.DiGraph:
        """A ``networkx`` view: node and edge attributes as documented in the module.

        Chip nodes carry ``instance``, ``domain`` and (on a torus) ``coords``; the graph
        attribute ``torus_dims`` gives the torus size. Built on first use: costly at scale.
        """
        if self._graph is None:
            import networkx as nx

            g = nx.DiGraph()
            if self.torus_dims:
                g.graph["torus_dims"] = self.torus_dims
            for i, node in enumerate(self._nodes):
                if i < self.n_chips:
                    attrs: dict[str, object] = {
                        "kind": "chip",
                        "instance": self.instance_of(i),
                        "domain": int(self.chip_domain[i]),
                    }
                    if self.chip_coords is not None:
                        attrs["coords"] = tuple(int(x) for x in self.chip_coords[i])
                    g.add_node(node, **attrs)
                else:
                    g.add_node(node, kind=str(node[0]))
            kinds = self.kinds
            for link in range(self.n_links):
                u, v = self.endpoints(link)
                g.add_edge(
                    u,
                    v,
                    link=link,
                    kind=str(kinds[link]),
                    capacity_Bps=float(self.capacity_Bps[link]),
                    latency_s=float(self.latency_s[link]),
                    lanes=self.lanes(link),
                    lanes_up=self.lanes_up(link),
                    state=self.state(link),
                )
            self._graph = g
        return self._graph
