"""Max-min rates of the entities of one component of the flow model (:mod:`.flownetwork`).

Entities of one group in a component (the same step of several gradient buckets in
flight) cross the same links with the same counts, so progressive filling raises
and freezes them together: they are solved as one column of ``k`` times the
counts, which gives each the rate it gets solved apart. The links of a component
are gathered by :func:`union`, which avoids sorting every entry when the columns
are long (folded steps on switched fabrics cross thousands of links each).

With ``classes`` (what the flow model runs) a component is solved over the links
its groups share and one row per group for its tightest private link, found
through the group's link classes (:mod:`.classes`): the rates of the solve over
every link, bit for bit, at a cost that grows with the shared links only.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from clustersim.errors import SimulationError
from clustersim.network.flows.classes import ClassCache, Common, intersect, private_row, tightest
from clustersim.network.flows.entity import FlowGroup, LinkIds, compact_links
from clustersim.network.flows.linkstats import LoadPattern
from clustersim.network.flows.live import Shared
from clustersim.network.flows.maxmin import maxmin_rates_csc, with_ceilings

__all__ = ["Scratch", "Solved", "solve_groups", "union"]

_FEW = 512
"""Entries below which :func:`union` sorts them all (np.unique)."""

Solved = tuple[NDArray[np.float64], LoadPattern]
"""The rates of a component's entities, and the loads they put on its links."""


class Scratch:
    """A slot per capacity, reused by :func:`union` and by the users it is lent to (each
    reads only what it wrote, so its values are never read stale), and
    the groups' link classes under the capacities of now (``classes``: clear it when they
    change)."""

    def __init__(self) -> None:
        self.slot: NDArray[np.int32] = np.zeros(0, dtype=np.int32)
        self.classes = ClassCache()

    def slots(self, size: int) -> NDArray[np.int32]:
        """A slot per capacity (32 bits: a slot holds a position among a solve's links)."""
        if self.slot.size < size:
            self.slot = np.zeros(size, dtype=np.int32)
        return self.slot


def union(
    flat: NDArray[np.int64], scratch: Scratch, size: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``np.unique(flat, return_inverse=True)`` for entries in ``0..size-1``: the distinct
    values (sorted) and each entry's index among them. Many entries go through a
    scratch slot per value instead of a sort: only the distinct values are sorted."""
    if flat.size < _FEW:
        loaded, inverse = np.unique(flat, return_inverse=True)
        return loaded, inverse.ravel()
    slot = scratch.slots(size)
    at = np.arange(flat.size, dtype=np.int32)
    slot[flat] = at  # the last entry of each value wins
    loaded = flat[slot[flat] == at]
    loaded.sort()
    slot[loaded] = np.arange(loaded.size, dtype=np.int32)
    rows: NDArray[np.int64] = slot[flat].astype(np.int64)
    return loaded, rows


def solve_groups(
    groups: tuple[FlowGroup, ...],
    cap: NDArray[np.float64],
    hbm_base: int | None,
    names: Callable[[LinkIds], list[str]],
    scratch: Scratch | None = None,
    *,
    common: Common | None = None,
    classes: bool | None = None,
) -> Solved:
    """Max-min rates of entities routed as ``groups`` over capacities ``cap``, with their
    links' loads; ``hbm_base`` is the first HBM index when HBM is shared (left out of the
    loads), ``names`` names links in errors.

    An entity alone on its links runs at the rate of its tightest link; repeats of
    a group are one column (see the module doc). With ``classes`` (by default when
    ``common`` is given), over the shared links and link classes; ``common(a, b)`` gives
    the links two groups share (default: intersected now).
    """
    scratch = scratch or Scratch()
    solve = _solve_columns
    if classes or (classes is None and common is not None):

        def solve(
            groups: tuple[FlowGroup, ...],
            times: NDArray[np.float64] | None,
            cap: NDArray[np.float64],
            hbm_base: int | None,
            scratch: Scratch,
        ) -> Solved:
            return _solve_classes(groups, times, cap, hbm_base, scratch, common=common or intersect)

    index: dict[int, int] = {}
    of = [index.setdefault(id(g), len(index)) for g in groups]
    if len(index) < len(groups):
        distinct = tuple({id(g): g for g in groups}.values())
        times = np.bincount(np.asarray(of), minlength=len(distinct)).astype(np.float64)
        rates_d, pattern = solve(distinct, times, cap, hbm_base, scratch)
        rates = rates_d[np.asarray(of)]
        out: Solved = (rates, pattern)
    else:
        out = solve(groups, None, cap, hbm_base, scratch)
        rates = out[0]
    # Rate 0 is a stall: a link on the route has failed and routing has not
    # noticed yet (capacity factor 0, see LinkTable.set_capacity_factor).
    if not (rates.min() >= 0 and np.isfinite(rates).all()):
        bad = int(np.argmin(rates)) if rates.min() < 0 else int(np.argmax(~np.isfinite(rates)))
        raise SimulationError(
            f"transfer over links {names(groups[bad].links)} got rate {rates[bad]}: "
            "a link on its route has no capacity"
        )
    return out


def _solve_columns(
    groups: tuple[FlowGroup, ...],
    times: NDArray[np.float64] | None,
    cap: NDArray[np.float64],
    hbm_base: int | None,
    scratch: Scratch,
) -> Solved:
    """Max-min rates of distinct ``groups``, group ``i`` standing for ``times[i]``
    entities (default 1 each), with their links' loads."""
    if len(groups) == 1 and groups[0].links.size:
        (g,) = groups
        cap_nz = cap[g.links]
        per = g.counts if times is None else g.counts * times[0]
        rate = min(float((cap_nz / per).min()), g.rate_cap_Bps)
        return np.asarray([rate]), LoadPattern((g,), (rate if times is None else rate * times[0],))
    capped = [i for i, g in enumerate(groups) if g.rate_cap_Bps < math.inf]
    nnz = np.asarray([g.links.size for g in groups], dtype=np.int64)
    counts = np.concatenate([g.counts for g in groups])
    if times is not None:
        counts = counts * np.repeat(times, nnz)
    loaded, rows = union(np.concatenate([g.links for g in groups]), scratch, cap.size)
    capacity = cap[loaded]
    if capped:
        # A rate ceiling is a private link of that capacity, crossed once.
        ceilings = np.asarray([groups[i].rate_cap_Bps for i in capped])
        nnz, rows, counts, capacity = with_ceilings(
            np.asarray(capped, dtype=np.int64), ceilings, (nnz, rows, counts), capacity
        )
    indptr = np.zeros(len(groups) + 1, dtype=np.int64)
    np.cumsum(nnz, out=indptr[1:])
    rates = maxmin_rates_csc(indptr, rows, counts, capacity)
    n = loaded.size
    # The links that several groups load: their utilisation, for the peaks (HBM left out).
    shared = np.flatnonzero(np.bincount(rows, minlength=capacity.size)[:n] > 1)
    if hbm_base is not None and shared.size:
        shared = shared[loaded[shared] < hbm_base]
    util = np.zeros(shared.size)
    if shared.size:
        load = np.bincount(rows, weights=counts * np.repeat(rates, nnz), minlength=capacity.size)
        cap_s = capacity[shared]
        np.divide(load[shared], cap_s, out=util, where=cap_s > 0)
    per = rates[: len(groups)] if times is None else rates[: len(groups)] * times
    return rates, LoadPattern(groups, per.tolist(), loaded[shared].astype(np.int64), util)


def _solve_classes(
    groups: tuple[FlowGroup, ...],
    times: NDArray[np.float64] | None,
    cap: NDArray[np.float64],
    hbm_base: int | None,
    scratch: Scratch,
    *,
    common: Common,
) -> Solved:
    """:func:`_solve_columns` over the links several of ``groups`` share, with a row per
    group for its tightest private link (see the module doc): the same rates and loads."""
    k = len(groups)
    known = scratch.classes
    if k == 1 and groups[0].links.size:
        (g,) = groups
        found = known.of(g, cap)
        t = None if times is None else float(times[0])
        if found is None:
            cls_cap, cls_count = cap[g.links], g.counts
        else:
            cls_cap, cls_count = found.cap, found.count
        i = tightest(cls_cap, cls_count, t)
        per = cls_count[i] if t is None else cls_count[i] * t
        rate = min(float(cls_cap[i] / per), g.rate_cap_Bps)
        return np.asarray([rate]), LoadPattern((g,), (rate if t is None else rate * t,))
    parts: list[list[Shared]] = [[] for _ in range(k)]
    for i in range(k):
        for j in range(i + 1, k):
            both = common(groups[i], groups[j])
            if both.links.size:
                parts[i].append(both)
                parts[j].append(both)
    # Each group's shared links (positions in its links), and all of them.
    at_of = [
        _merge([s.at(g) for s in part], g.links.size) for g, part in zip(groups, parts, strict=True)
    ]
    mine = [g.links[at] for g, at in zip(groups, at_of, strict=True)]
    distinct = {id(s): s for part in parts for s in part}
    shared = next(iter(distinct.values())).links if len(distinct) == 1 else _merge(mine)
    n_shared = shared.size
    # Each group's column: its shared links' rows, its tightest private link's, then its
    # rate ceiling's (see with_ceilings), as pieces joined once.
    row_parts: list[list[NDArray[np.int64]]] = []
    count_parts: list[list[NDArray[np.float64]]] = []
    private_cap: list[float] = []
    slot = None
    if n_shared > _FEW:  # each shared link's row through a slot, not a search per group
        slot = scratch.slots(cap.size)
        slot[shared] = np.arange(n_shared, dtype=np.int32)
    for i, g in enumerate(groups):
        at = at_of[i]
        if at.size == n_shared:
            rows = np.arange(n_shared, dtype=np.int64)
        elif slot is not None:
            rows = slot[mine[i]].astype(np.int64)
        else:
            rows = np.searchsorted(shared, mine[i]).astype(np.int64)
        counts = g.counts[at]
        t = None if times is None else float(times[i])
        row = private_row(g, known.of(g, cap), cap, at, t) if g.links.size > at.size else None
        rows_i, counts_i = [rows], [counts]
        if row is not None:
            rows_i.append(np.asarray([n_shared + len(private_cap)], dtype=np.int64))
            counts_i.append(np.asarray([row[1]]))
            private_cap.append(row[0])
        if t is not None:  # the flows of its entities (ceilings are crossed once)
            counts_i = [c * t for c in counts_i]
        row_parts.append(rows_i)
        count_parts.append(counts_i)
    n_rows = n_shared + len(private_cap)
    capped = [i for i, g in enumerate(groups) if g.rate_cap_Bps < math.inf]
    for j, i in enumerate(capped):
        # A rate ceiling is a private link of that capacity, crossed once.
        row_parts[i].append(np.asarray([n_rows + j], dtype=np.int64))
        count_parts[i].append(np.ones(1))
    nnz = np.asarray([sum(p.size for p in parts) for parts in row_parts], dtype=np.int64)
    rows = np.concatenate([p for parts in row_parts for p in parts] or [np.zeros(0, np.int64)])
    counts = np.concatenate([c for parts in count_parts for c in parts] or [np.zeros(0)])
    ceilings = [groups[i].rate_cap_Bps for i in capped]
    capacity = np.concatenate([cap[shared], np.asarray(private_cap + ceilings, dtype=np.float64)])
    indptr = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(nnz, out=indptr[1:])
    rates = maxmin_rates_csc(indptr, rows, counts, capacity)
    keep = shared < hbm_base if hbm_base is not None else np.ones(n_shared, dtype=bool)
    util = np.zeros(int(np.count_nonzero(keep)))
    if util.size:
        load = np.bincount(rows, weights=counts * np.repeat(rates, nnz), minlength=capacity.size)
        cap_s = capacity[:n_shared][keep]
        np.divide(load[:n_shared][keep], cap_s, out=util, where=cap_s > 0)
    per = rates if times is None else rates * times
    # The shared links in 32 bits where they fit: the memo holds 10^6 to 10^7 of them.
    return rates, LoadPattern(groups, per.tolist(), compact_links(shared[keep]), util)


def _merge(parts: list[LinkIds], size: int | None = None) -> NDArray[np.int64]:
    """The distinct values of ``parts`` (each sorted and distinct), sorted. With ``size``
    (every value is below it) and many values, a mask over ``0..size-1`` replaces the sort."""
    arrays = list({id(p): p for p in parts}.values())
    if not arrays:
        return np.zeros(0, dtype=np.int64)
    if len(arrays) == 1:
        return arrays[0].astype(np.int64, copy=False)
    if size is not None and sum(a.size for a in arrays) * 16 >= size:
        mask = np.zeros(size, dtype=bool)
        for a in arrays:
            mask[a] = True
        return np.flatnonzero(mask).astype(np.int64)
    out = np.concatenate(arrays).astype(np.int64, copy=False)
    if not out.size:
        return out
    out.sort(kind="stable")  # runs of sorted values: a merge, not a full sort
    keep = np.empty(out.size, dtype=bool)
    keep[0] = True
    np.not_equal(out[1:], out[:-1], out=keep[1:])
    result: NDArray[np.int64] = out[keep]
    return result
