"""Routes over a topology's links: the routing half of :class:`~.topology.Topology`.

Inside a scale-up domain a pair takes the builder's path function (or its
:class:`~.domainpaths.LocalPaths` table, in bulk); between domains the
:class:`~.scaleout.ScaleOut` fabric routes pairs in bulk; when a preferred route
has a link down, routing falls back to the lowest-latency path over the links
still up. See :mod:`.topology` for the whole story.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
from numpy.typing import ArrayLike, NDArray

from clustersim.errors import PartitionError, SimulationError
from clustersim.network.fabric.links import Int64s, LinkTable
from clustersim.network.fabric.scaleout import ScaleOut

if TYPE_CHECKING:  # scipy loads on first use: a collective needs none of it
    import scipy.sparse as sp

    from clustersim.network.fabric.domainpaths import LocalPaths

__all__ = ["PathFn", "Routes", "crossing_pairs"]

PathFn: TypeAlias = Callable[[int, int], Sequence[int]]
"""``(src_chip, dst_chip) -> node ids`` from ``src_chip`` to ``dst_chip`` (chip node id =
chip index), for two distinct chips of one domain (of any domains when the topology has
no scale-out fabric)."""

_HOP_EPS_S = 1e-12
"""Added to each link's latency for fallback routing: ties go to fewer hops, and
zero-latency links stay edges of the sparse graph."""


def crossing_pairs(
    src: Int64s,
    dst: Int64s,
    times: Int64s | None,
    cross: NDArray[np.bool_],
    spread: int,
) -> tuple[Int64s, Int64s, Int64s | None, Int64s | None]:
    """The pairs ``cross`` marks (all of them without copying when every pair crosses),
    each repeated ``spread`` times with its path offset when a scale-out fabric spreads a
    pair's traffic over ``spread`` paths: (sources, targets, times, offsets or None)."""
    whole = bool(cross.all())
    s, d = (src, dst) if whole else (src[cross], dst[cross])
    t = times if times is None or whole else times[cross]
    offset = None
    if spread > 1:
        offset = np.tile(np.arange(spread, dtype=np.int64), s.size)
        s, d = np.repeat(s, spread), np.repeat(d, spread)
        t = None if t is None else np.repeat(t, spread)
    return s, d, t, offset


def row_sums(values: NDArray[np.float64]) -> NDArray[np.float64]:
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


class Routes(LinkTable):
    """Cached routes between the chips of a :class:`~.topology.Topology` (its base class:
    the topology sets the attributes declared here)."""

    max_cached_routes: int = 1 << 20
    max_cached_sources: int = 256

    path_fn: PathFn | None
    local_paths: LocalPaths | None
    scaleout: ScaleOut | None
    chip_domain: Int64s
    local_links: Int64s
    _routes: dict[tuple[int, int], tuple[int, ...]]
    _pred: dict[int, NDArray[np.int32]]
    _usable_csr: sp.csr_matrix | None

    if TYPE_CHECKING:

        @property
        def n_chips(self) -> int: ...
        @property
        def n_domains(self) -> int: ...
        def local_link(self, chip: int) -> int: ...

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

    def route_loads(
        self, src: Int64s, dst: Int64s
    ) -> tuple[Int64s, NDArray[np.float64], float] | None:
        """The distinct links (sorted) that the routes of pairs ``(src[i], dst[i])`` cross,
        the flows on each and the longest route's latency, computed without listing each
        route's links; None where this topology has no such method (the caller then counts
        :meth:`weighted_routes`). A graph's topology has one
        (:mod:`clustersim.network.graphs.routeloads`)."""
        del src, dst
        return None

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
            s, d, t, offset = crossing_pairs(sources, targets, times, cross, spread)
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
                lat_parts.append(row_sums(self.latency_s[matrix]))
            else:
                flat_parts.append(matrix[real])
                lat_parts.append(row_sums(np.where(real, self.latency_s[matrix], 0.0)))
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
        links, hops = self.local_paths.links(
            src, dst, self.links_between, self.n_domains, check=self.are_links
        )
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
        if self.scaleout is not None and self.chip_domain[src] != self.chip_domain[dst]:
            matrix, _ = self.scaleout.paths(np.asarray([src]), np.asarray([dst]), None)
            return tuple(int(x) for x in matrix[0] if x >= 0)
        # Without a scale-out fabric the path function routes every pair (an imported
        # graph's, across its instances too), as the routes of many pairs at once do.
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
