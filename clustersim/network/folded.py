"""Which links the flows of a folded step load (a mixin of :class:`~.core.Network`).

A folded step stands for every replica's flows as one entity, and routes only the
flows that can reach links other replicas share (:meth:`FoldedRoutes._reaching`),
keeping the first replica's links with every flow's load on them
(:meth:`FoldedRoutes._on_links`); :meth:`~.core.Network._folded_group` builds the
group from them.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from clustersim.network.fabric import ScaleOut, Topology, distinct_pairs

__all__ = ["FoldedRoutes"]

_IntArray = NDArray[np.int64]
_DISTINCT_FROM = 4096
"""Flows inside domains above which repeated pairs are merged before routing."""
_FAR_MASKS = 4
"""Masks of far chips' host links kept (one bit per link each)."""


class FoldedRoutes:
    """The routing of folded steps, half of :class:`~.core.Network` (its base class: the
    network sets the attributes declared here)."""

    topology: Topology
    _pos: _IntArray
    _far_masks: dict[tuple[int, bytes], NDArray[np.bool_]]

    def _on_links(
        self, kept: _IntArray, flat: _IntArray, weights: NDArray[np.float64] | None
    ) -> tuple[_IntArray, NDArray[np.float64]]:
        """The distinct links of ``kept`` (sorted), and the weighted count of the entries
        of ``flat`` on each: a position per link, not a search of every entry."""
        n = self.topology.n_links
        if self._pos.size < n:
            self._pos = np.full(n, -1, dtype=np.int64)
        pos = self._pos
        # The distinct links: the last entry of each wins its slot; only they are sorted.
        at = np.arange(kept.size, dtype=np.int64)
        pos[kept] = at
        links = kept[pos[kept] == at]
        links.sort()
        pos[links] = np.arange(links.size, dtype=np.int64)
        at = pos[flat]
        pos[links] = -1  # the table is all -1 again between calls
        hit = at >= 0
        counts = np.bincount(
            at[hit], weights=None if weights is None else weights[hit], minlength=links.size
        ).astype(np.float64)
        return links.astype(np.int64), counts

    def _far_hosts(self, near: NDArray[np.bool_], scaleout: ScaleOut) -> NDArray[np.bool_]:
        """A mask of the links between chips outside the ``near`` domains and their leaves
        (kept for the last few sets of domains: a stage's steps share theirs)."""
        topo = self.topology
        key = (topo.version, near.tobytes())
        found = self._far_masks.get(key)
        if found is not None:
            return found
        far = np.flatnonzero(~near[topo.chip_domain])
        host = np.zeros(topo.n_links, dtype=bool)
        for links in scaleout.host_links(far, far):
            host[links] = True
        if len(self._far_masks) >= _FAR_MASKS:
            self._far_masks.pop(next(iter(self._far_masks)))
        self._far_masks[key] = host
        return host

    def _reaching(
        self, src: _IntArray, dst: _IntArray, rep_src: _IntArray, rep_dst: _IntArray
    ) -> tuple[_IntArray, NDArray[np.float64] | None, float, bool]:
        """The links (a multiset, with their weights) of the flows ``src -> dst`` that can
        reach links the flows ``rep_src -> rep_dst`` share with others, every flow's
        longest latency, and whether the entity must keep all of those links (see
        :meth:`_folded_group`).

        While every link is up a route inside a scale-up domain stays in it, so only
        flows of the representative's domains are routed there. On a :attr:`private
        <clustersim.network.fabric.scaleout.ScaleOut.private>` fabric a flow between domains
        crosses just its two chips' links, taken without routing; on others, every
        flow between domains is routed (they meet on the shared tiers).
        """
        topo = self.topology
        if topo.links_down or topo.n_domains == 1:
            flat, weights, latency = topo.weighted_routes(src, dst)
            return flat, weights, float(latency.max()) if latency.size else 0.0, True
        domain = topo.chip_domain
        near = np.zeros(topo.n_domains, dtype=bool)
        near[domain[rep_src]] = near[domain[rep_dst]] = True
        src_dom, dst_dom = domain[src], domain[dst]
        cross = src_dom != dst_dom
        if topo.scaleout is None or not topo.scaleout.private:
            keep = cross | near[src_dom]
            pair_src, pair_dst, times = src[keep], dst[keep], None
            spread = topo.scaleout.spread if topo.scaleout is not None else 1
            if pair_src.size > _DISTINCT_FROM and not spread & (spread - 1):
                # Repeated pairs routed once (ECMP hashes the pair, so its copies take one
                # path), counted by their flows; whole flows over a power-of-two spread
                # sum exactly as the copies' shares would.
                n = topo.n_chips
                code, times = np.unique(pair_src * n + pair_dst, return_counts=True)
                pair_src, pair_dst = code // n, code % n
            flat, weights, latency = topo.weighted_routes(pair_src, pair_dst, times)
            longest = float(latency.max()) if latency.size else 0.0
            if topo.scaleout is None:
                return flat, weights, longest, True
            # A chip's own links to its leaf carry what the representative's chips carry
            # (the domains are placed alike): only theirs are kept, with the shared tiers.
            mine = ~self._far_hosts(near, topo.scaleout)[flat]
            return flat[mine], None if weights is None else weights[mine], longest, True
        inside = ~cross & near[src_dom]
        weights = None
        n_inside = int(np.count_nonzero(inside))
        if topo.local_paths is not None and n_inside > _DISTINCT_FROM:
            # Ranks that share chips repeat pairs: each distinct path is routed once,
            # weighted by its flows (counts of whole flows: the same sums).
            if n_inside < src.size:
                src_in, dst_in, dom_in = src[inside], dst[inside], src_dom[inside]
            else:  # every flow (a step inside the representative's domains)
                src_in, dst_in, dom_in = src, dst, src_dom
            cpd = topo.chips_per_domain
            pairs = distinct_pairs(src_in, dst_in, dom_in, cpd, topo.n_domains)
            flat, weights, latency = topo.weighted_routes(*pairs)
        else:
            flat, _, latency = topo.weighted_routes(src[inside], dst[inside])
        longest = float(latency.max()) if latency.size else 0.0
        if not cross.any():
            return flat, weights, longest, False
        up, down = topo.scaleout.host_links(src[cross], dst[cross])
        lat = topo.latency_s
        longest = max(longest, float((lat[up] + lat[down]).max()))
        # Only the links of chips in the representative's domains can be its links.
        up = up[near[src_dom[cross]]]
        down = down[near[dst_dom[cross]]]
        if weights is not None:
            weights = np.concatenate([weights, np.ones(up.size + down.size)])
        return np.concatenate([flat, up, down]), weights, longest, False
