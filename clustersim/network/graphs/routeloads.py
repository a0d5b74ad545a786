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

**Two hops through one node.** A pair whose source has a single link out, to the
node that holds the destination's single link in, routes over those two links
whatever the tables say (a star's or a leaf switch's chips): its counts are
bincounts of the sources' up-links and the destinations' down-links, and its
latency the sum of the two, as its route sums them. Only the other pairs go
through the tables.

Where a table cannot serve (a torus graph with a link down takes its preferred
path and the fallback; a pair cut off) :func:`route_loads` returns None and the
caller routes pair by pair.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
from numpy.typing import NDArray

from clustersim.network.fabric import Int64s, Topology, ecmp_hash

__all__ = ["Hub", "NextHops", "route_loads"]

NextHops: TypeAlias = Callable[
    [int], tuple[NDArray[np.int32], NDArray[np.int32], NDArray[np.int32]]
]
"""A destination's next-hop table: ``(first, counts, hops)``, each node's equal-cost next
hops being ``hops[first[u] : first[u] + counts[u]]`` (:meth:`.custom.GraphTopology._next_hops`)."""

Floats = NDArray[np.float64]

_CHUNK_ENTRIES = 1 << 20
"""Destinations per chunk x nodes: the dense per-destination arrays of one chunk."""
_WALK_PAIRS = 1 << 16
"""Pairs walked at once to sum their latencies route by route."""
_LATENCY_RTOL = 1e-9
"""Pairs whose estimated latency is this close to the longest are summed exactly."""


@dataclass(frozen=True, slots=True)
class Hub:
    """Each chip's only link out (``up``) and only link in (``down``) over the links
    routes take; -1 where a chip has several (or none)."""

    up: Int64s
    down: Int64s

    def pairs(self, topo: Topology, src: Int64s, dst: Int64s) -> NDArray[np.bool_]:
        """Which pairs (``src != dst``) route over ``up[src]`` then ``down[dst]``: those
        two links meet at one node."""
        up, down = self.up[src], self.down[dst]
        meet: NDArray[np.bool_] = (up >= 0) & (down >= 0) & (topo.link_v[up] == topo.link_u[down])
        return meet


class _Chunk:
    """The next-hop tables of some destinations, as flat arrays indexed ``row * n + node``."""

    def __init__(self, topo: Topology, dsts: Int64s, next_hops: NextHops) -> None:
        n = topo.n_nodes
        self.n = n
        k = dsts.size
        firsts, counts, hops = [], [], []
        offset = 0
        for d in dsts.tolist():
            first, count, hop = next_hops(d)
            firsts.append(first + offset)  # int32 + int: int64 past 2**31 entries
            counts.append(count)
            hops.append(hop)
            offset += hop.size
        self.first = np.concatenate(firsts)
        self.count = np.concatenate(counts)
        self.hop = np.concatenate(hops)
        one = np.flatnonzero(self.count == 1)
        nxt_node = self.hop[self.first[one]].astype(np.int64)
        at_node = one % n
        link_next = np.full(k * n, -1, dtype=np.int64)
        link_next[one] = topo.links_between(at_node, nxt_node)
        self.link_next = link_next
        """The link out of each node with a single next hop (else -1)."""
        step = np.arange(k * n, dtype=np.int64)
        step[one] += nxt_node - at_node
        self.step = step
        """The node after each node with a single next hop (itself elsewhere)."""
        # Pointer jumping: where each chain of single next hops ends, its length, its
        # latency (an estimate: summed in another order than along the route) and the
        # least and greatest latency of its links.
        end = step.copy()
        depth = np.zeros(k * n, dtype=np.int64)
        depth[one] = 1
        lat = np.zeros(k * n)
        lat[one] = topo.latency_s[link_next[one]]
        lo = np.full(k * n, np.inf)
        lo[one] = lat[one]
        hi = np.full(k * n, -np.inf)
        hi[one] = lat[one]
        while True:
            after = end[end]
            if np.array_equal(after, end):
                break
            lat += lat[end]
            depth += depth[end]
            np.minimum(lo, lo[end], out=lo)
            np.maximum(hi, hi[end], out=hi)
            end = after
        roots = np.arange(k, dtype=np.int64) * n + dsts
        self.tree: NDArray[np.bool_] = end == np.repeat(roots, n)
        """Nodes whose single-hop chain reaches the destination: the forest."""
        self.depth = depth
        self.lat_to_root = lat
        self.lat_lo = lo
        self.lat_hi = hi


def _walk_latencies(topo: Topology, chunk: _Chunk, g: Int64s, number: Int64s) -> Floats:
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
    topo: Topology, next_hops: NextHops, src: Int64s, dst: Int64s, hub: Hub | None = None
) -> tuple[Int64s, Floats, float] | None:
    """The distinct links the routes of pairs ``(src[i], dst[i])`` cross (sorted), the flows
    on each, and the longest route's latency: what routing every pair and counting its
    links gives, to the last bit, where every pair follows ``next_hops``; None where a
    pair is cut off (its per-pair route names the cut). ``hub`` names the chips' single
    links, whose pairs two hops apart are counted without the tables."""
    n, n_links = topo.n_nodes, topo.n_links
    total = np.zeros(n_links)
    latency = 0.0
    same = src == dst
    if same.any():
        local = topo.local_links[src[same]]
        total += np.bincount(local, minlength=n_links)
        latency = float(topo.latency_s[local].max())
        src, dst = src[~same], dst[~same]
    if hub is not None and src.size:
        two = hub.pairs(topo, src, dst)
        if two.any():
            up, down = hub.up[src[two]], hub.down[dst[two]]
            total += np.bincount(up, minlength=n_links)
            total += np.bincount(down, minlength=n_links)
            latency = max(latency, float((topo.latency_s[up] + topo.latency_s[down]).max()))
            src, dst = src[~two], dst[~two]
    if not src.size:
        links = np.flatnonzero(total).astype(np.int64)
        return links, total[links], latency
    # The pairs by destination (a radix sort), then the destinations a chunk at a time.
    order = np.argsort(_small(dst), kind="stable")
    per_dst = np.bincount(dst, minlength=topo.n_chips)
    dsts = np.flatnonzero(per_dst)
    row_of = np.zeros(topo.n_chips, dtype=np.int64)
    ends = np.cumsum(per_dst[dsts])
    per_chunk = max(1, _CHUNK_ENTRIES // n)
    for c0 in range(0, dsts.size, per_chunk):
        chunk_dsts = dsts[c0 : c0 + per_chunk]
        chunk = _Chunk(topo, chunk_dsts, next_hops)
        pick = order[(int(ends[c0 - 1]) if c0 else 0) : int(ends[c0 + chunk_dsts.size - 1])]
        s, d = src[pick], dst[pick]
        row_of[chunk_dsts] = np.arange(chunk_dsts.size)
        g0 = row_of[d] * n + s
        del pick, s
        if not chunk.count[g0].all():
            return None  # a pair cut off: the per-pair routes name the cut
        found = _loads(topo, chunk, g0, d, total)
        if found is None:
            return None
        latency = max(latency, _longest(topo, chunk, g0, d, found))
    links = np.flatnonzero(total).astype(np.int64)
    return links, total[links], latency


def _small(values: Int64s) -> NDArray[np.integer]:
    """``values`` (non-negative) as 16-bit integers where they fit: numpy's stable sort of
    them is a radix sort."""
    if values.size and int(values.max()) < 1 << 16:
        return values.astype(np.uint16)
    return values


def _numbers(topo: Topology, g: Int64s, d: Int64s, n: int) -> Int64s:
    """The ECMP path number of each pair from flat node ``g`` to chip ``d``."""
    cpi = topo.chips_per_instance
    out: Int64s = d + ecmp_hash(g % n // cpi, d // cpi)
    return out


@dataclass(frozen=True, slots=True)
class _Found:
    """Where each pair enters the forest (``at``, flat) and, for the pairs that walk there
    first (``walked``), the latency of their walk, its links and the least and greatest of
    their latencies."""

    at: Int64s
    walked: Int64s
    lat: Floats
    hops: Int64s
    lo: Floats
    hi: Floats


def _longest(topo: Topology, chunk: _Chunk, g: Int64s, d: Int64s, found: _Found) -> float:
    """The longest route latency, summed as the per-pair routes sum theirs: over the pairs
    whose estimate is within :data:`_LATENCY_RTOL` of the longest. A route whose links
    all have one latency sums as any other of its length does, so one of each length and
    latency is summed; the others are walked."""
    at = found.at
    estimate = chunk.lat_to_root[at]
    estimate[found.walked] += found.lat
    top = float(estimate.max())
    near = np.flatnonzero(estimate >= top * (1 - _LATENCY_RTOL))
    del estimate
    hops, lo, hi = chunk.depth[at[near]], chunk.lat_lo[at[near]], chunk.lat_hi[at[near]]
    if found.walked.size:
        mine = np.searchsorted(found.walked, near)
        mine[mine == found.walked.size] = 0
        walker = found.walked[mine] == near
        w = mine[walker]
        hops[walker] += found.hops[w]
        lo[walker] = np.minimum(lo[walker], found.lo[w])
        hi[walker] = np.maximum(hi[walker], found.hi[w])
    best = -np.inf
    alike = lo == hi
    if alike.any():
        hops_a, value = hops[alike], lo[alike]
        values = value[:1] if value.min() == value.max() else np.unique(value)
        for v in values.tolist():
            lengths = np.flatnonzero(
                np.bincount(hops_a if values.size == 1 else hops_a[value == v])
            )
            for h in lengths.tolist():
                best = max(best, float(np.add.reduceat(np.full(h, v), [0])[0]))
    near = near[~alike]
    for k in range(0, near.size, _WALK_PAIRS):
        pick = near[k : k + _WALK_PAIRS]
        number = _numbers(topo, g[pick], d[pick], chunk.n)
        best = max(best, float(_walk_latencies(topo, chunk, g[pick], number).max()))
    return best


def _loads(topo: Topology, chunk: _Chunk, g: Int64s, d: Int64s, total: Floats) -> _Found | None:
    """Add the flows of pairs from flat nodes ``g`` to chips ``d`` to ``total`` (per link);
    where they enter the forest and what their walks there crossed, or None if a walk
    meets a node with no next hop."""
    n, n_links = chunk.n, total.size
    at = g.copy()
    walked = np.flatnonzero(~chunk.tree[at])
    lat_walk = np.zeros(walked.size)
    hops = np.zeros(walked.size, dtype=np.int64)
    lo = np.full(walked.size, np.inf)
    hi = np.full(walked.size, -np.inf)
    walking = np.arange(walked.size)
    node_g = at[walked]
    num = _numbers(topo, node_g, d[walked], n)
    while walking.size:
        c = chunk.count[node_g]
        if not c.all():
            return None
        idx = chunk.first[node_g] + num % c
        v = chunk.hop[idx].astype(np.int64)
        link = topo.links_between(node_g % n, v)
        total += np.bincount(link, minlength=n_links)
        lat = topo.latency_s[link]
        lat_walk[walking] += lat
        hops[walking] += 1
        lo[walking] = np.minimum(lo[walking], lat)
        hi[walking] = np.maximum(hi[walking], lat)
        num //= c
        node_g = node_g - node_g % n + v
        at[walked[walking]] = node_g
        keep = ~chunk.tree[node_g]
        walking, node_g, num = walking[keep], node_g[keep], num[keep]
    # The forest: flows entering at each node, passed down level by level.
    weight = np.bincount(at, minlength=chunk.count.size).astype(np.float64)
    inner = np.flatnonzero(chunk.tree & (chunk.link_next >= 0))
    if inner.size:
        depth = chunk.depth[inner]
        inner = inner[np.argsort(_small(int(depth.max()) - depth), kind="stable")]
        depth = chunk.depth[inner]
        cuts = np.flatnonzero(np.diff(depth)) + 1
        for level in np.split(inner, cuts):
            np.add.at(weight, chunk.step[level], weight[level])
        loaded = inner[weight[inner] > 0]
        total += np.bincount(chunk.link_next[loaded], weights=weight[loaded], minlength=n_links)
    return _Found(at, walked, lat_walk, hops, lo, hi)
