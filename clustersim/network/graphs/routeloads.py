"""The loads a group of chip pairs puts on a graph's links, without a route per pair.

A step's flow group needs only how many of its flows cross each link and the
longest route's latency (:class:`~clustersim.network.flows.entity.FlowGroup`). The
routes themselves hold pairs x hops entries: a 64 MiB all-to-all over a 1,024-chip
ring crosses 268 million of them. :func:`route_loads` computes the same counts
from the next-hop tables of :class:`~.custom.GraphTopology`, in memory that grows
with the chips and the pairs, not with pairs x hops.

**Routes as a forest.** Towards one destination ``d``, a node with a single
equal-cost next hop passes every flow on to it, whatever the flow's path number
(the ECMP digit it takes at a branching node is ``number mod 1``). Where no
branching node lies between a node and ``d`` (found by pointer jumping along
the single next hops), the flows at that node follow one chain to ``d``: those
nodes form an in-forest rooted at ``d``, and the flows on the link out of a node
are the flows that enter the forest at it or at any node above it, summed level
by level from the deepest. Only flows that start above a branching node (a fat
tree's up-links, a ring's antipode) walk hop by hop, with their path numbers,
until they enter the forest.

**The same numbers.** Counts are whole numbers summed in float64, so they equal
the per-route counts exactly. The longest latency is first estimated from the
forest (sums in another order), then every pair within a relative 1e-9 of the
estimate is walked and summed route by route, as the per-pair path sums them
(``numpy.add.reduceat``), so the maximum is the per-route one to the last bit.

Where a table cannot serve (a torus graph with a link down takes its preferred
path and the fallback; a pair cut off) :func:`route_loads` returns None and the
caller routes pair by pair.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from clustersim.network.fabric import Int64s, ecmp_hash

if TYPE_CHECKING:
    from clustersim.network.graphs.custom import GraphTopology

__all__ = ["route_loads"]

Floats = NDArray[np.float64]

_CHUNK_ENTRIES = 1 << 22
"""Destinations per chunk x nodes: the dense per-destination arrays of one chunk."""
_WALK_PAIRS = 1 << 16
"""Pairs walked at once to sum their latencies route by route."""
_LATENCY_RTOL = 1e-9
"""Pairs whose estimated latency is this close to the longest are summed exactly."""


class _Chunk:
    """The next-hop tables of some destinations, as flat arrays indexed ``row * n + node``."""

    def __init__(self, topo: GraphTopology, dsts: Int64s, live: bool) -> None:
        n = topo.n_nodes
        self.n = n
        k = dsts.size
        firsts, counts, hops = [], [], []
        offset = 0
        for d in dsts.tolist():
            first, count, hop = topo._next_hops(d, live=live)
            firsts.append(first.astype(np.int64) + offset)
            counts.append(count)
            hops.append(hop)
            offset += hop.size
        self.first: Int64s = np.concatenate(firsts)
        self.count: Int64s = np.concatenate(counts).astype(np.int64)
        self.hop: Int64s = np.concatenate(hops).astype(np.int64)
        flat = np.arange(k * n, dtype=np.int64)
        one = np.flatnonzero(self.count == 1)
        nxt_node = self.hop[self.first[one]]
        link_next = np.full(k * n, -1, dtype=np.int64)
        link_next[one] = topo.links_between(one % n, nxt_node)
        self.link_next = link_next
        """The link out of each node with a single next hop (else -1)."""
        step = flat.copy()
        step[one] = one - one % n + nxt_node
        self.step = step
        """The node after each node with a single next hop (itself elsewhere)."""
        # Pointer jumping: where each chain of single next hops ends, its length and its
        # latency (an estimate: summed in another order than along the route).
        end, depth = step.copy(), (step != flat).astype(np.int64)
        lat = np.zeros(k * n)
        lat[one] = topo.latency_s[link_next[one]]
        while True:
            after = end[end]
            if np.array_equal(after, end):
                break
            lat = lat + lat[end]
            depth = depth + depth[end]
            end = after
        self.tree: NDArray[np.bool_] = end == np.repeat(np.arange(k) * n + dsts, n)
        """Nodes whose single-hop chain reaches the destination: the forest."""
        self.depth = depth
        self.lat_to_root = lat


def _walk_latencies(topo: GraphTopology, chunk: _Chunk, g: Int64s, number: Int64s) -> Floats:
    """Each route's latency from node ``g`` (flat) with path number ``number``, summed as
    the per-pair routes sum theirs."""
    n = chunk.n
    active = np.arange(g.size)
    node_g, num = g.copy(), number.copy()
    steps: list[tuple[Int64s, Floats]] = []
    while active.size:
        c = chunk.count[node_g]
        moving = c > 0
        active, node_g, num, c = active[moving], node_g[moving], num[moving], c[moving]
        if not active.size:
            break
        idx = chunk.first[node_g] + num % c
        v = chunk.hop[idx]
        link = topo.links_between(node_g % n, v)
        steps.append((active, topo.latency_s[link]))
        num //= c
        node_g = node_g - node_g % n + v
    hops = np.zeros(g.size, dtype=np.int64)
    for who, _ in steps:
        hops[who] += 1
    # Lay each route's latencies out contiguously, in route order, and sum each as
    # the per-pair routes are summed.
    starts = np.zeros(g.size, dtype=np.int64)
    np.cumsum(hops[:-1], out=starts[1:])
    flat = np.zeros(int(hops.sum()))
    filled = starts.copy()
    for who, lat in steps:
        flat[filled[who]] = lat
        filled[who] += 1
    out: Floats = np.add.reduceat(flat, starts) if flat.size else np.zeros(g.size)
    return out


def route_loads(
    topo: GraphTopology, src: Int64s, dst: Int64s
) -> tuple[Int64s, Floats, float] | None:
    """The distinct links the routes of pairs ``(src[i], dst[i])`` cross (sorted), the flows
    on each, and the longest route's latency: what routing every pair and counting its
    links gives, to the last bit. None where the per-pair routes must be taken (a torus
    graph with a link down, a pair cut off)."""
    live = topo.chip_coords is None
    if not live and topo.links_down:
        return None
    n, n_links = topo.n_nodes, topo.n_links
    total = np.zeros(n_links)
    latency = 0.0
    same = src == dst
    if same.any():
        local = topo.local_links[src[same]]
        total += np.bincount(local, minlength=n_links)
        latency = float(topo.latency_s[local].max())
    src, dst = src[~same], dst[~same]
    if not src.size:
        links = np.flatnonzero(total).astype(np.int64)
        return links, total[links], latency
    order = np.argsort(dst, kind="stable")
    src, dst = src[order], dst[order]
    dsts, first_pair = np.unique(dst, return_index=True)
    per_chunk = max(1, _CHUNK_ENTRIES // n)
    bounds = [*first_pair[::per_chunk].tolist(), src.size]
    cpi = topo.chips_per_instance
    for c0, c1, lo in zip(
        range(0, dsts.size, per_chunk),
        range(per_chunk, dsts.size + per_chunk, per_chunk),
        range(len(bounds) - 1),
        strict=True,
    ):
        chunk_dsts = dsts[c0:c1]
        chunk = _Chunk(topo, chunk_dsts, live)
        s, d = src[bounds[lo] : bounds[lo + 1]], dst[bounds[lo] : bounds[lo + 1]]
        row = np.searchsorted(chunk_dsts, d)
        g0 = row * n + s
        if not chunk.count[g0].all():
            return None  # a pair cut off: the per-pair routes name the cut
        number = d + ecmp_hash(s // cpi, d // cpi)
        estimate = _loads(topo, chunk, g0, number, total)
        if estimate is None:
            return None
        top = float(estimate.max())
        near = np.flatnonzero(estimate >= top * (1 - _LATENCY_RTOL))
        for k in range(0, near.size, _WALK_PAIRS):
            pick = near[k : k + _WALK_PAIRS]
            exact = _walk_latencies(topo, chunk, g0[pick], number[pick])
            latency = max(latency, float(exact.max()))
    links = np.flatnonzero(total).astype(np.int64)
    return links, total[links], latency


def _loads(
    topo: GraphTopology, chunk: _Chunk, g: Int64s, number: Int64s, total: Floats
) -> Floats | None:
    """Add the flows of pairs starting at flat nodes ``g`` to ``total`` (per link); each
    pair's estimated route latency, or None if a walk meets a node with no next hop."""
    n, n_links = chunk.n, total.size
    lat_walk = np.zeros(g.size)
    at = g.copy()
    walking = np.flatnonzero(~chunk.tree[at])
    node_g, num = at[walking], number[walking]
    while walking.size:
        c = chunk.count[node_g]
        if not c.all():
            return None
        idx = chunk.first[node_g] + num % c
        v = chunk.hop[idx]
        link = topo.links_between(node_g % n, v)
        total += np.bincount(link, minlength=n_links)
        lat_walk[walking] += topo.latency_s[link]
        num //= c
        node_g = node_g - node_g % n + v
        at[walking] = node_g
        keep = ~chunk.tree[node_g]
        walking, node_g, num = walking[keep], node_g[keep], num[keep]
    # The forest: flows entering at each node, passed down level by level.
    weight = np.bincount(at, minlength=chunk.count.size).astype(np.float64)
    inner = np.flatnonzero(chunk.tree & (chunk.link_next >= 0))
    if inner.size:
        depth = chunk.depth[inner]
        inner = inner[np.argsort(-depth, kind="stable")]
        depth = chunk.depth[inner]
        cuts = np.flatnonzero(np.diff(depth)) + 1
        for level in np.split(inner, cuts):
            np.add.at(weight, chunk.step[level], weight[level])
        loaded = inner[weight[inner] > 0]
        total += np.bincount(chunk.link_next[loaded], weights=weight[loaded], minlength=n_links)
    out: Floats = lat_walk + chunk.lat_to_root[at]
    return out
