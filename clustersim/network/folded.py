"""Which links the flows of a folded step load (a mixin of :class:`~.core.Network`).

A folded step stands for every replica's flows as one entity, and routes only the
flows that can reach links other replicas share (:meth:`FoldedRoutes._reaching`),
keeping the first replica's links with every flow's load on them
(:meth:`FoldedRoutes._on_links`); :meth:`~.core.Network._folded_group` builds the
group from them. The chips of the replicas' rows, the distinct rows among them and
whether their pairs of chips can repeat are found here too, once per replicas array
(:meth:`FoldedRoutes._replica_rows`, :meth:`FoldedRoutes._repeats`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from clustersim.errors import SimulationError
from clustersim.network.fabric import (
    ScaleOut,
    Topology,
    TreeFabric,
    crossing_pairs,
    distinct_pairs,
    row_sums,
)
from clustersim.network.flows import FlowNetwork

__all__ = ["FoldedRoutes"]

_IntArray = NDArray[np.int64]
_DISTINCT_FROM = 4096
"""Flows inside domains above which repeated pairs are merged before routing."""
_FAR_MASKS = 4
"""Masks of far chips' host links kept (one bit per link each)."""
_ROWS_BY_DICT = 4096
"""Replica rows up to which distinct rows are found by their bytes, not by a sort."""

_MARK_FROM = 32
"""Entries above a 32nd of the span of their link ids: their distinct links are found by
marks over the span (a scan of a byte per link beats a sort of the distinct ones)."""
_INT32_MAX = int(np.iinfo(np.int32).max)

Repeats = tuple[_IntArray, _IntArray, _IntArray]
"""The flows of a folded step's distinct rows of chips: sources, destinations, and how
many replicas' flows each stands for."""
Flows = tuple[Repeats | None, Callable[[], bool]]
"""The flows of a folded step's distinct rows (None when no two rows are alike), and
whether no two of the flows routed (those, or every row's) join the same pair of chips
(found when asked)."""


def distinct_rows(rows: _IntArray, n_chips: int) -> tuple[_IntArray, _IntArray] | None:
    """The first row of each distinct row of chips in ``rows`` and how many rows repeat
    it, or None when no two rows are alike.

    Ranks that share a chip (four per Trn2 chip at LNC=2) make replica rows whose
    chips are the same: their flows take the same routes, so each distinct row is
    routed once and its flows counted as many times as it repeats.
    """
    n_rows, width = rows.shape
    if n_rows < 2:
        return None
    if width <= 2:
        code = rows[:, 0] * n_chips + rows[:, -1]
        _, first, times = np.unique(code, return_index=True, return_counts=True)
    elif n_rows <= _ROWS_BY_DICT:
        seen: dict[bytes, int] = {}
        for i, row in enumerate(rows):
            seen.setdefault(row.tobytes(), i)
        if len(seen) == n_rows:
            return None
        first = np.fromiter(seen.values(), dtype=np.int64, count=len(seen))
        index = np.full(n_rows, -1, dtype=np.int64)
        index[first] = np.arange(first.size, dtype=np.int64)
        owner = np.asarray([seen[row.tobytes()] for row in rows], dtype=np.int64)
        times = np.bincount(index[owner], minlength=first.size)
    else:
        _, first, times = np.unique(rows, axis=0, return_index=True, return_counts=True)
    if first.size == n_rows:
        return None
    return first.astype(np.int64), times.astype(np.int64)


def apart(values: _IntArray, slot: NDArray[np.int32] | None = None) -> bool:
    """Whether no value of ``values`` repeats; ``slot``, a scratch position per value (each
    value below its size), replaces a sort: the last of equal values wins the slot."""
    if slot is None or values.size > _INT32_MAX:
        return bool(np.unique(values).size == values.size)
    at = np.arange(values.size, dtype=np.int32)
    slot[values] = at
    return bool((slot[values] == at).all())


class FoldedRoutes:
    """The routing of folded steps, half of :class:`~.core.Network` (its base class: the
    network sets the attributes declared here)."""

    topology: Topology
    flows: FlowNetwork
    max_cached_plans: int
    _chips: _IntArray
    _distinct: dict[int, tuple[object, tuple[_IntArray, _IntArray] | None, bool | None]]
    _rows: dict[int, tuple[object, dict[int, object]]]
    _pairs_apart: dict[bytes, bool]
    _mark: NDArray[np.bool_]
    _tier_latency: tuple[int, bool] | None
    _far_masks: dict[tuple[int, bytes], NDArray[np.bool_]]

    def _rows_chips(self, rows: ArrayLike, width: int, what: str) -> _IntArray:
        """The chips of ``rows`` of ranks (a 2D array, ``width`` ranks per row)."""
        arr = np.asarray(rows, dtype=np.int64)
        if arr.ndim != 2 or arr.shape[1] != width or arr.shape[0] == 0:
            raise SimulationError(f"{what} must be rows of {width} ranks (got shape {arr.shape})")
        n = self._chips.size
        if arr.min() < 0 or arr.max() >= n:
            raise SimulationError(f"{what} name ranks outside 0..{n - 1}")
        chips: _IntArray = self._chips[arr]
        return chips

    def _replica_rows(self, replicas: ArrayLike, ranks: Sequence[int], what: str) -> _IntArray:
        """The chips of ``replicas``, rows of ranks that must start with ``ranks`` (the
        check is made once per replicas array and row: the steps of a collective share
        them, and the row of a large group costs a conversion of its Python ints)."""
        rows = self._rows_chips(replicas, len(ranks), what)
        found = self._rows.get(id(replicas))
        if found is None or found[0] is not replicas:
            if len(self._rows) >= self.max_cached_plans:
                self._rows.clear()
            found = self._rows[id(replicas)] = (replicas, {})  # holds the array: no id reuse
        checked = found[1]
        if checked.get(id(ranks)) is not ranks:
            if not np.array_equal(rows[0], self._rows_chips([ranks], len(ranks), what)[0]):
                raise SimulationError(f"{what} must start with the row of ranks {list(ranks)[:8]}")
            checked[id(ranks)] = ranks  # holds the row: its id is not reused
        return rows

    def _repeats(
        self, replicas: ArrayLike, rows: _IntArray, pairs: _IntArray, digest: bytes
    ) -> Flows:
        """The flows of ``pairs`` in the distinct rows of chips of ``replicas`` (``rows``),
        each with how many rows repeat it, or None when no two rows are alike; and whether
        the flows routed join distinct pairs of chips: those rows hold no chip twice and
        ``pairs`` (``digest``) no pair twice (each cached per replicas array and pairs)."""
        found = self._distinct.get(id(replicas))
        if found is None or found[0] is not replicas:
            if len(self._distinct) >= self.max_cached_plans:
                self._distinct.clear()
            found = (replicas, distinct_rows(rows, self.topology.n_chips), None)
            self._distinct[id(replicas)] = found  # holds the array: its id is not reused
        distinct = found[1]

        def alone() -> bool:
            known = self._distinct[id(replicas)]
            if known[2] is None:
                used = rows if distinct is None else rows[distinct[0]]
                slot = self.flows.slots(self.topology.n_chips)
                known = (replicas, distinct, apart(used.ravel(), slot))
                self._distinct[id(replicas)] = known
            if not known[2]:
                return False
            found = self._pairs_apart.get(digest)
            if found is None:
                if len(self._pairs_apart) >= self.max_cached_plans:
                    self._pairs_apart.clear()
                width = int(pairs.max()) + 1 if pairs.size else 1
                found = self._pairs_apart[digest] = apart(pairs[:, 0] * width + pairs[:, 1])
            return found

        if distinct is None:
            return None, alone
        first, times = distinct
        unique = rows[first]
        flows = (
            unique.take(pairs[:, 0], axis=1).ravel(),
            unique.take(pairs[:, 1], axis=1).ravel(),
            np.repeat(times, pairs.shape[0]),
        )
        return flows, alone

    def _on_links(
        self, kept: _IntArray, flat: _IntArray, weights: NDArray[np.float64] | None
    ) -> tuple[_IntArray, NDArray[np.float64]]:
        """The distinct links of ``kept`` (sorted), and the weighted count of the entries
        of ``flat`` on each: a position per link, not a search of every entry."""
        n = self.topology.n_links
        if self._mark.size < n:
            self._mark = np.zeros(n, dtype=bool)  # False but during this call
        # The flow model's scratch, 32 bits: a position is below a group's entries.
        pos = self.flows.slots(n)
        lo, hi = (int(kept.min()), int(kept.max()) + 1) if kept.size else (0, 0)
        if kept.size * _MARK_FROM >= hi - lo:
            # Many entries for the span of their ids: the links are read off a mark per
            # link of the span, already in order.
            mark = self._mark
            mark[kept] = True
            links = np.flatnonzero(mark[lo:hi])
            links += lo
            mark[links] = False
        else:
            # The last entry of each link wins its slot; only the distinct links are sorted,
            # in 32 bits where the ids fit (numpy sorts those several times faster).
            at = np.arange(kept.size, dtype=np.int32)
            pos[kept] = at
            links = kept[pos[kept] == at]
            if n <= _INT32_MAX:
                links = links.astype(np.int32)
            links.sort()
        pos[links] = np.arange(links.size, dtype=np.int32)
        if kept is flat:
            at = pos[flat]
        else:  # entries of flat off the kept links count nowhere
            mark = self._mark
            mark[links] = True
            hit = mark[flat]
            mark[links] = False
            at = pos[flat[hit]]
            weights = None if weights is None else weights[hit]
        counts = np.bincount(at, weights=weights, minlength=links.size).astype(np.float64)
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

    def _tree_routes(
        self,
        src: _IntArray,
        dst: _IntArray,
        times: _IntArray | None,
        near: NDArray[np.bool_],
        *,
        alone: Callable[[], bool] | None = None,
    ) -> tuple[_IntArray, NDArray[np.float64] | None, float]:
        """:meth:`~clustersim.network.fabric.Routes.weighted_routes` of the pairs ``src ->
        dst`` on a tree fabric with every link up, less the links between chips outside
        the ``near`` domains and their leaves, and the longest latency.

        The entries between domains come in the order ``weighted_routes`` gives them, so
        every link's weighted count sums alike; repeated pairs inside domains are routed
        once, weighted by their flows (whole numbers: the same sums in any order), unless
        ``alone()`` says that no pair repeats. A chip is a leaf of the tree:
        its own links are the first and the last of a path between domains, so those of
        chips outside the near domains are dropped by the pair's ends, not found among
        every entry.
        """
        topo = self.topology
        tree = topo.scaleout
        assert isinstance(tree, TreeFabric)
        spread = tree.spread
        domain = topo.chip_domain
        cross = domain[src] != domain[dst]
        n_cross = int(np.count_nonzero(cross))
        flats: list[_IntArray] = []
        weights: list[NDArray[np.float64] | None] = []
        longest = 0.0
        if n_cross < src.size:  # inside the near domains: every link is theirs
            inside = ~cross
            src_in, dst_in = src[inside], dst[inside]
            times_in = None if times is None else times[inside]
            many = topo.local_paths is not None and src_in.size > _DISTINCT_FROM
            if many and not (alone is not None and alone()):
                src_in, dst_in, times_in = distinct_pairs(
                    src_in,
                    dst_in,
                    domain[src_in],
                    topo.chips_per_domain,
                    topo.n_domains,
                    times=times_in,
                )
            flat, w, latency = topo.weighted_routes(src_in, dst_in, times_in)
            flats.append(flat)
            weights.append(w)
            longest = float(latency.max()) if latency.size else 0.0
        if n_cross:
            s, d, t, offset = crossing_pairs(src, dst, times, cross, spread)
            matrix, _, turn = tree.paths_turning(s, d, None, offset)
            hops = 2 * turn + 2  # a path up to level m and down has 2m + 2 links
            longest = max(longest, self._longest_path(tree, matrix, hops))
            # The first link of a path is its source's up link, the last its target's down link.
            near_src, near_dst = near[domain[s]], near[domain[d]]
            real = matrix >= 0
            real[:, 0] = near_src
            if hops.min() == matrix.shape[1]:  # every path in every column
                real[:, -1] = near_dst
            else:
                far_dst = np.flatnonzero(~near_dst)
                real[far_dst, hops[far_dst] - 1] = False
            flats.append(matrix[real])
            if t is None:
                w = None if spread == 1 else np.full(flats[-1].size, 1.0 / spread)
            else:
                # Each path's weight on each of its links kept, row after row.
                kept = hops - (~near_src) - (~near_dst)
                w = np.repeat(t.astype(np.float64), kept)
                if spread > 1:
                    w *= 1.0 / spread
            weights.append(w)
        flat = flats[0] if len(flats) == 1 else np.concatenate(flats)
        if all(w is None for w in weights):
            return flat, None, longest
        filled = [np.ones(f.size) if w is None else w for f, w in zip(flats, weights, strict=True)]
        return flat, filled[0] if len(filled) == 1 else np.concatenate(filled), longest

    def _longest_path(self, tree: TreeFabric, matrix: _IntArray, hops: _IntArray) -> float:
        """The longest latency of the paths ``matrix`` (links where not -1; ``hops`` each)
        of ``tree``, as their row sums give it. Where every link of each kind (a chip's up
        or down link, a tier's up or down links) has one latency, the paths that turn at
        one tier are rows of equal values: one of them per tier is summed."""
        lat = self.topology.latency_s
        version = self.topology.version
        if self._tier_latency is None or self._tier_latency[0] != version:
            kinds = [tree.host_up, tree.host_down, *tree.up, *tree.down]
            alike = all(np.unique(lat[links]).size <= 1 for links in kinds)
            self._tier_latency = (version, alike)
        if self._tier_latency[1]:
            rows = [int(np.argmax(hops == n)) for n in np.flatnonzero(np.bincount(hops))]
            matrix = matrix[rows]
        real = matrix >= 0
        if real.all():
            return float(row_sums(lat[matrix]).max())
        return float(row_sums(np.where(real, lat[matrix], 0.0)).max())

    def _reaching(
        self,
        src: _IntArray,
        dst: _IntArray,
        rep_src: _IntArray,
        rep_dst: _IntArray,
        repeats: Callable[[], Flows] | None = None,
    ) -> tuple[_IntArray, NDArray[np.float64] | None, float, bool]:
        """The links (a multiset, with their weights) of the flows ``src -> dst`` that can
        reach links the flows ``rep_src -> rep_dst`` share with others, every flow's
        longest latency, and whether the entity must keep all of those links (see
        :meth:`_folded_group`). ``repeats``, where given, gives the same flows from the
        distinct rows of chips only, each with its count (:func:`distinct_rows`), or None.

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
        if topo.scaleout is None or not topo.scaleout.private:
            spread = topo.scaleout.spread if topo.scaleout is not None else 1
            whole = not spread & (spread - 1)  # copies' shares sum exactly
            distinct, alone = repeats() if repeats is not None and whole else (None, None)
            times: _IntArray | None = None
            if distinct is not None:
                # The distinct rows' flows, each counted for its copies: the same whole
                # numbers of flows on every link as routing each copy.
                src, dst, times = distinct
            src_dom = domain[src]
            keep = (src_dom != domain[dst]) | near[src_dom]
            pair_src, pair_dst = src[keep], dst[keep]
            if times is not None:
                times = times[keep]
            if isinstance(topo.scaleout, TreeFabric):
                flat, weights, longest = self._tree_routes(
                    pair_src, pair_dst, times, near, alone=alone
                )
                return flat, weights, longest, True
            if times is None and pair_src.size > _DISTINCT_FROM and whole:
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
        src_dom, dst_dom = domain[src], domain[dst]
        cross = src_dom != dst_dom
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
