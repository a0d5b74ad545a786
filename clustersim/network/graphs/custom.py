"""A user's fabric graph compiled into the numpy columns and routes the solver runs on.

:class:`GraphTopology` is a :class:`~clustersim.network.fabric.topology.Topology` built
from a checked :class:`~.graphcheck.FabricSpec`: chips are ``("chip", i)`` as in the built
fabrics, every other node is the 1-tuple of its name in the graph, and each
chip gets its ``local`` link from the chip's catalog entry. :attr:`GraphTopology.aliases`
maps the graph's own node names to node ids, so failure injection can name
them (``target: {link: [n0g1, sw0]}``).

**Routing** is by latency, with ECMP. For each destination, Dijkstra over the
links that are up (:mod:`.shortest`: a binary heap for a small graph's first few, then
scipy's csgraph; each link weighted by its latency plus
:data:`HOP_EPS_S`, so ties go to fewer hops) gives every node its distance to
the destination; a link is on a shortest path when it closes that distance
exactly (to a relative 1e-9). Where the graph gives torus coordinates, a chip
prefers the hop along the lowest axis that still differs, ``+1`` first from an
even coordinate on it and ``-1`` first from an odd one: routes on a torus are
dimension-ordered, with ties split by parity, as the built tori route. Among the other equal
next hops, a pair ``(s, d)`` takes path number ``d + hash(instance of s,
instance of d)``, decoded in mixed radix: at a node with ``k`` equal next hops it
takes hop ``number mod k`` and carries ``number // k`` on. Consecutive
destinations thus leave a switch by different uplinks and, one tier up, by
different uplinks again (D-mod-k, as the built fat trees route), and the hash
decorrelates instance pairs. Routes are compiled by the topology's bulk path
lookup into the same route arrays the built fabrics use. Tables are kept per
destination (bounded); a chip with a single link in takes its neighbour's table,
completed, so a fat tree of single-homed chips runs one Dijkstra per leaf.

When a link goes down, routes on a graph with torus coordinates keep their
preferred paths and the topology falls back to the lowest-latency path over the
links still up for the pairs they cut, as on the built tori. On other graphs the
tables are rebuilt over the links still up, so a cut pair takes another of its
equal-cost paths, as on the built fat trees. With no path left the topology
raises :class:`~clustersim.errors.PartitionError` naming the cut.

**Folding** needs every replica's traffic to be an image of the representative's.
That is proven here only one way: the graph is the scenario's built-in fabric
link for link (names, capacities, latencies, lanes), whose builder declares the
symmetry. Otherwise :attr:`GraphTopology.fold_refusal` says why, and the run
simulates every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TypeAlias

import numpy as np
from numpy.typing import NDArray

from clustersim.errors import ScenarioError, SimulationError
from clustersim.network.fabric import Int64s, LinkKind, Topology, ecmp_hash, node_name
from clustersim.network.graphs.graphcheck import FabricSpec, check_fabric
from clustersim.network.graphs.graphio import read_fabric
from clustersim.network.graphs.routeloads import Hub, route_loads
from clustersim.network.graphs.shortest import Distances

__all__ = ["HOP_EPS_S", "GraphTopology", "load_graph", "same_fabric"]

HOP_EPS_S = 1e-12
"""Added to each link's latency when routing: ties go to fewer hops."""
_TIE_RTOL = 1e-9
_MAX_TABLE_ENTRIES = 1 << 25
"""Next-hop table entries kept (4 bytes each), over all destinations."""
_Table: TypeAlias = tuple[NDArray[np.int32], NDArray[np.int32], NDArray[np.int32]]


@dataclass(frozen=True, eq=False)
class _RoutingGraph:
    """The links routes may take (one topology version), for the next-hop tables."""

    u: Int64s
    v: Int64s
    weight: NDArray[np.float64]
    rank: Int64s
    distances: Distances
    """Each node's distance to a destination over these links (Dijkstra)."""
    gateway: Int64s
    """Of each chip with a single link in: the node at its other end (else -1)."""
    hub: Hub
    """Each chip's only link out and only link in (-1 where it has several), the
    two-hop routes of :func:`~.routeloads.route_loads`."""


class GraphTopology(Topology):
    """A topology compiled from a user's graph, routed by latency with ECMP."""

    def __init__(
        self,
        spec: FabricSpec,
        *,
        chips_per_instance: int,
        instances: int,
        local_bw_Bps: float,
        local_latency_s: float = 0.0,
    ) -> None:
        super().__init__(
            spec.name,
            chips_per_instance=chips_per_instance,
            instances=instances,
            local_bw_Bps=local_bw_Bps,
            local_latency_s=local_latency_s,
            domain_instances=spec.domain_instances,
        )
        n_chips = spec.n_chips
        self.add_nodes([(label,) for label in spec.labels[n_chips:]])
        self.labels: list[str] = list(spec.labels)
        """Each node's name in the graph, by node id."""
        self.node_kinds: list[str] = list(spec.kinds)
        self.aliases: dict[str, int] = {label: i for i, label in enumerate(spec.labels)}
        """The graph's node names, for failure injection."""
        kinds = np.asarray(spec.link_kinds)
        link_of = np.zeros(spec.u.size, dtype=np.int64)
        for lanes in np.unique(spec.lanes).tolist():
            for kind in np.unique(kinds).tolist():
                rows = np.flatnonzero((spec.lanes == lanes) & (kinds == kind))
                if rows.size:
                    link_of[rows] = self.add_links(
                        spec.u[rows],
                        spec.v[rows],
                        capacity_Bps=spec.capacity_Bps[rows],
                        latency_s=spec.latency_s[rows],
                        lanes=int(lanes),
                        kind=_link_kind(kind),
                    )
        for row in np.flatnonzero(spec.lanes_up < spec.lanes).tolist():
            self.set_lanes_up(int(link_of[row]), int(spec.lanes_up[row]))
        if spec.coords is not None:
            self.set_chip_coords(spec.coords, spec.dims)
        self.fold_refusal: str | None = (
            "the graph's symmetry is not proven (it is not the scenario's built-in fabric)"
        )
        """Why folding may not be used; None where the symmetry is proven."""
        self._tables: dict[tuple[int, bool], _Table] = {}
        self._entries = 0
        self._tables_version = -1
        self._graphs: dict[bool, _RoutingGraph] = {}
        self.path_fn = self._path

    def prove_symmetry(self, built: Topology) -> None:
        """Allow folding when this graph is ``built`` (a built-in fabric) link for link."""
        if same_fabric(self, built):
            self.fold_refusal = None

    # -- routing --------------------------------------------------------------------------------

    def route_loads(
        self, src: Int64s, dst: Int64s
    ) -> tuple[Int64s, NDArray[np.float64], float] | None:
        """The loads of the routes of many pairs, from the next-hop tables
        (:func:`~.routeloads.route_loads`); None where routes go pair by pair: a pair
        cut off, or a graph with torus coordinates and a link down (its routes keep
        their preferred paths and fall back where those are cut)."""
        live = self.chip_coords is None
        if not live and self.links_down:
            return None
        hub = self._routing(live).hub
        return route_loads(self, lambda dst: self._next_hops(dst, live=live), src, dst, hub)

    def _path(self, src: int, dst: int) -> list[int]:
        # On a torus a route keeps its preferred path, and the topology's fallback takes
        # over where a link of it is down, as on the built tori; elsewhere routes take
        # the equal-cost paths left over the links that are up, as the built fat trees do.
        live = self.chip_coords is None
        table = self._next_hops(dst, live=live)
        if live and table[1][src] == 0:  # cut off: a path the fallback will refuse, naming it
            table = self._next_hops(dst, live=False)
        first, counts, hops = table
        # The path number, decoded digit by digit at each branching node (mixed radix).
        number = dst + int(ecmp_hash(self.instance_of(src), self.instance_of(dst)))
        path = [src]
        node = src
        for _ in range(self.n_nodes):
            if node == dst:
                return path
            k = int(counts[node])
            node = int(hops[first[node] + number % k])
            number //= k
            path.append(node)
        raise AssertionError("shortest-path tables are loop-free")  # pragma: no cover

    def _routing(self, live: bool) -> _RoutingGraph:
        """The routing graph of this topology version (the tables are dropped with it)."""
        if self._tables_version != self.version:
            self._tables.clear()
            self._graphs.clear()
            self._entries = 0
            self._tables_version = self.version
        return self._graphs.get(live) or self._routing_graph(live)

    def _next_hops(self, dst: int, *, live: bool) -> _Table:
        """Each node's equal-cost next hops towards ``dst``: ``hops[first[u] : first[u] +
        counts[u]]`` (``counts[u]`` is 0 where ``u`` cannot reach it)."""
        g = self._routing(live)
        key = (dst, live)
        found = self._tables.get(key)
        if found is not None:
            return found
        gateway = int(g.gateway[dst])
        # A chip reached only through one node: every shortest path to it is one to that
        # node and then the link in, so its table is the node's, completed.
        table = self._table(dst, g) if gateway < 0 else self._through(dst, gateway, live)
        self._entries += table[0].size + table[1].size + table[2].size
        if self._entries > _MAX_TABLE_ENTRIES:
            self._tables.clear()
            self._entries = 0
        self._tables[key] = table
        return table

    def _through(self, dst: int, gateway: int, live: bool) -> _Table:
        first, counts, hops = self._next_hops(gateway, live=live)
        first, counts = first.copy(), counts.copy()
        first[gateway], counts[gateway], counts[dst] = hops.size, 1, 0
        return first, counts, np.append(hops, np.int32(dst))

    def _table(self, dst: int, g: _RoutingGraph) -> _Table:
        n = self.n_nodes
        dist = g.distances.to(dst)
        du, dv = dist[g.u], dist[g.v]
        tight = np.flatnonzero(
            np.isfinite(du) & np.isfinite(dv) & (np.abs(dv + g.weight - du) <= _TIE_RTOL * du)
        )
        # Links are sorted by (source, preference, target): the first tight link of each
        # source has its best preference, and only its equals are kept.
        cu, rank = g.u[tight], g.rank[tight]
        start = np.ones(tight.size, dtype=bool)
        start[1:] = cu[1:] != cu[:-1]
        best = rank[np.flatnonzero(start)][np.cumsum(start) - 1]
        keep = tight[rank == best]
        counts = np.bincount(g.u[keep], minlength=n).astype(np.int32)
        first = (np.cumsum(counts) - counts).astype(np.int32)
        return first, counts, g.v[keep].astype(np.int32)

    def _routing_graph(self, live: bool) -> _RoutingGraph:
        """The links routes may take, sorted by (source, preference, target), with their
        distances to a destination."""
        u, v = self.link_u, self.link_v
        use = u != v
        if live:
            use &= self._lanes_up.view > 0
        uu, vv = u[use], v[use]
        rank = self._move_rank(uu, vv)
        order = np.lexsort((vv, rank, uu))
        uu, vv, rank = uu[order], vv[order], rank[order]
        link = np.flatnonzero(use)[order]
        weight = (self.latency_s + HOP_EPS_S)[use][order]
        n = self.n_nodes
        distances = Distances(n, uu, vv, weight)
        into = np.bincount(vv, minlength=n)
        gateway = np.full(n, -1, dtype=np.int64)
        only = np.flatnonzero(into[vv] == 1)
        chips = only[vv[only] < self.n_chips]
        gateway[vv[chips]] = uu[chips]
        down = np.full(self.n_chips, -1, dtype=np.int64)
        down[vv[chips]] = link[chips]
        up = np.full(self.n_chips, -1, dtype=np.int64)
        alone = np.flatnonzero(np.bincount(uu, minlength=n)[uu] == 1)
        alone = alone[uu[alone] < self.n_chips]
        up[uu[alone]] = link[alone]
        g = _RoutingGraph(uu, vv, weight, rank, distances, gateway, Hub(up, down))
        self._graphs[live] = g
        return g

    def _move_rank(self, cu: Int64s, cv: Int64s) -> Int64s:
        """Preference of each hop ``cu -> cv`` among a node's equal-cost next hops.

        Between two chips of a domain with torus coordinates: ``2 x axis`` along
        ``+1`` of the lowest axis they differ on, ``2 x axis + 1`` the other way
        (the other way first from an odd coordinate on that axis), which makes routes
        dimension-ordered (axis 0 first, a peer half way round reached the positive way
        from an even coordinate and the negative way from an odd one) as torus fabrics
        route. Every other hop ranks after them, equal among themselves.
        """
        coords = self.chip_coords
        rank = np.full(cu.size, 2 * len(self.torus_dims) + 2, dtype=np.int64)
        if coords is None or not cu.size:
            return rank
        n_chips = self.n_chips
        both = (cu < n_chips) & (cv < n_chips)
        rows = np.flatnonzero(both)
        a, b = cu[rows], cv[rows]
        rows = rows[self.chip_domain[a] == self.chip_domain[b]]
        a, b = cu[rows], cv[rows]
        differ = coords[a] != coords[b]
        axis = np.argmax(differ, axis=1)
        dims = np.asarray(self.torus_dims, dtype=np.int64)
        pick = np.arange(rows.size)
        step = (coords[b][pick, axis] - coords[a][pick, axis]) % dims[axis]
        odd = coords[a][pick, axis] % 2 == 1
        rank[rows] = 2 * axis + ((step != 1) ^ odd)
        return rank


def _link_kind(kind: str) -> LinkKind:
    for known in ("neuronlink", "switch", "efa"):
        if kind == known:
            return known
    raise ValueError(f"unknown link kind {kind!r}")  # the checks refuse it first


def same_fabric(graph: Topology, built: Topology) -> bool:
    """Whether two topologies have the same nodes (by name) and links (by endpoints), with the
    same capacities, latencies, lanes and lanes up."""
    if graph.n_nodes != built.n_nodes or graph.n_links != built.n_links:
        return False
    if graph.n_chips != built.n_chips or graph.domain_instances != built.domain_instances:
        return False
    labels = getattr(graph, "labels", None)
    names = labels if isinstance(labels, list) else _names(graph)
    built_names = _names(built)
    if names[: graph.n_chips] != built_names[: built.n_chips]:
        return False
    index = {name: i for i, name in enumerate(built_names)}
    try:
        to_built = np.asarray([index[str(name)] for name in names], dtype=np.int64)
        links: Int64s = built.links_between(to_built[graph.link_u], to_built[graph.link_v])
    except (KeyError, SimulationError):
        return False
    return bool(
        np.allclose(graph.nominal_Bps, built.nominal_Bps[links], rtol=1e-9, atol=0)
        and np.allclose(graph.latency_s, built.latency_s[links], rtol=1e-9, atol=0)
        and all(
            graph.lanes(i) == built.lanes(int(j)) and graph.lanes_up(i) == built.lanes_up(int(j))
            for i, j in enumerate(links.tolist())
        )
    )


def _names(topo: Topology) -> list[str]:
    return [node_name(topo.node(i)) for i in range(topo.n_nodes)]


@lru_cache(maxsize=8)
def _checked(path: str, stamp: tuple[int, int], cpi: int, instances: int, where: str) -> FabricSpec:
    del stamp  # part of the key only: a rewritten file is read again
    graph = read_fabric(Path(path), where)
    return check_fabric(graph, chips_per_instance=cpi, instances=instances, where=where)


def load_graph(
    path: str | Path,
    *,
    chips_per_instance: int,
    instances: int,
    local_bw_Bps: float,
    local_latency_s: float = 0.0,
    where: str,
) -> GraphTopology:
    """The fabric graph in ``path`` read, checked and compiled; errors name ``where``.

    The checked graph is kept per file (path, size and modification time) and cluster
    shape, so that checking a scenario and simulating it read the file once.
    """
    file = Path(path)
    try:
        st = file.stat()
    except OSError:
        raise ScenarioError(where, str(path), "no such file") from None
    spec = _checked(
        str(file.resolve()), (st.st_size, st.st_mtime_ns), chips_per_instance, instances, where
    )
    return GraphTopology(
        spec,
        chips_per_instance=chips_per_instance,
        instances=instances,
        local_bw_Bps=local_bw_Bps,
        local_latency_s=local_latency_s,
    )
