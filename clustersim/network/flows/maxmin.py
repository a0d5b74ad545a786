"""Max-min fair rates of coflows over links, by progressive filling.

An *entity* (a coflow) is a set of flows that move at one common rate: the
flows of one step of a collective, which are step-synchronised. The incidence
matrix has one row per link and one column per entity; ``incidence[l, e]`` is
the number of the entity's flows that cross link ``l``, so the load on the
links is ``incidence @ rate``. The max-min fair allocation raises every rate
together until some link saturates, freezes the entities crossing it, and
continues with the rest (Bertsekas & Gallager, *Data Networks*, section 6.5.2).
Each frozen entity then has a *bottleneck*: a saturated link on which no other
entity is faster.

:func:`maxmin_rates` loops over bottleneck levels only. It keeps, per link, the
level at which the link would saturate; that level moves only when an entity
crossing the link freezes, so each round is a minimum over the links plus work
proportional to the nonzeros of the entities it freezes: a solve costs
O(levels x links + nonzeros), in a couple of dozen numpy calls per level.
:func:`maxmin_rates_reference` is the same algorithm in plain Python, for tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:  # scipy loads on first use: the simulator's solve needs none of it
    import scipy.sparse as sp

__all__ = [
    "DEFAULT_RTOL",
    "maxmin_rates",
    "maxmin_rates_csc",
    "maxmin_rates_reference",
    "with_ceilings",
]

LinkMajor = Callable[[], NDArray[np.int64]]
"""Gives the entity of each nonzero in link-major order (built on first use)."""

DEFAULT_RTOL = 1e-9
"""Links whose saturation level is within this relative tolerance of the current
level saturate together, so near-ties cost one round, not many."""


def _span(
    indptr: NDArray[np.integer[Any]], rows: NDArray[np.integer[Any]]
) -> slice | NDArray[np.intp]:
    """Where the nonzeros of ``rows`` of a compressed matrix lie in its ``indices``/``data``."""
    if rows.size == 1:
        row = int(rows[0])
        return slice(int(indptr[row]), int(indptr[row + 1]))
    starts = indptr[rows].astype(np.intp)
    lengths = indptr[rows + 1].astype(np.intp) - starts
    ends = np.cumsum(lengths)
    # Shift arange(total) so that it runs through range(start, start + length) for each row.
    shift = np.repeat(starts - (ends - lengths), lengths)
    out: NDArray[np.intp] = np.arange(int(ends[-1]) if ends.size else 0, dtype=np.intp) + shift
    return out


def maxmin_rates(
    incidence: sp.csr_matrix | sp.csc_matrix | sp.csr_array | sp.csc_array,
    capacity_Bps: NDArray[np.float64],
    *,
    rtol: float = DEFAULT_RTOL,
) -> NDArray[np.float64]:
    """Max-min fair rate of each entity (column) given link capacities (one per row).

    Entities that cross no link get ``inf``. An entity crossing a link of zero
    capacity gets 0.
    """
    n_links, n_ent = incidence.shape
    cap = np.asarray(capacity_Bps, dtype=np.float64)
    if cap.shape != (n_links,):
        raise ValueError(f"capacity_Bps has shape {cap.shape}; the incidence has {n_links} links")
    by_link, by_ent = _both_orientations(incidence)
    if by_ent.nnz and by_ent.data.min() < 0:
        raise ValueError("incidence must be non-negative")
    weight = np.asarray(by_link.sum(axis=1), dtype=np.float64).ravel()
    return _fill(
        (by_link.indptr, by_link.indices),
        (by_ent.indptr, by_ent.indices, by_ent.data),
        weight=weight,
        cap=cap,
        n_ent=n_ent,
        rtol=rtol,
    )


def maxmin_rates_csc(
    indptr: NDArray[np.int64],
    rows: NDArray[np.int64],
    counts: NDArray[np.float64],
    capacity_Bps: NDArray[np.float64],
    *,
    rtol: float = DEFAULT_RTOL,
) -> NDArray[np.float64]:
    """:func:`maxmin_rates` on raw compressed-column arrays, for the simulator's hot path.

    Entity ``e``'s links are ``rows[indptr[e]:indptr[e+1]]`` (indices into
    ``capacity_Bps``) with flow counts ``counts[...]``, all positive. Building the
    link-major view with numpy (a stable sort and a bincount) avoids constructing
    scipy matrices on every solve, which costs more than the solve for the small
    systems a training step produces.
    """
    n_links = capacity_Bps.shape[0]
    n_ent = indptr.shape[0] - 1
    ent_of_nz = np.repeat(np.arange(n_ent, dtype=np.int64), np.diff(indptr))
    per_link = np.bincount(rows, minlength=n_links)
    l_ptr = np.zeros(n_links + 1, dtype=np.int64)
    np.cumsum(per_link, out=l_ptr[1:])
    weight = np.bincount(rows, weights=counts, minlength=n_links).astype(np.float64)

    def link_major() -> NDArray[np.int64]:
        by_link: NDArray[np.int64] = ent_of_nz[_stable_order(rows, n_links)]
        return by_link

    return _fill(
        (l_ptr, link_major),
        (indptr, rows, np.asarray(counts, dtype=np.float64)),
        weight=weight,
        cap=np.asarray(capacity_Bps, dtype=np.float64),
        n_ent=n_ent,
        rtol=rtol,
        ent_of_nz=ent_of_nz,
    )


def _stable_order(keys: NDArray[np.int64], size: int) -> NDArray[np.intp]:
    """``np.argsort(keys, kind="stable")`` of keys in ``0..size-1``, 16 bits at a time
    (numpy sorts 16-bit keys by radix, several times faster than 64-bit ones): the same
    order, which a stable sort makes unique."""
    if size > 1 << 32 or not keys.size:
        out: NDArray[np.intp] = np.argsort(keys, kind="stable")
        return out
    low = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
    if size <= 1 << 16:
        return low
    high = (keys[low] >> 16).astype(np.uint16)
    return low[np.argsort(high, kind="stable")]


def _fill(
    by_link: tuple[NDArray[np.integer[Any]], NDArray[np.integer[Any]] | LinkMajor],
    by_ent: tuple[NDArray[np.integer[Any]], NDArray[np.integer[Any]], NDArray[np.float64]],
    *,
    weight: NDArray[np.float64],
    cap: NDArray[np.float64],
    n_ent: int,
    rtol: float,
    ent_of_nz: NDArray[np.int64] | None = None,
) -> NDArray[np.float64]:
    """Progressive filling over both compressed views of the incidence.

    The link-major entities (``by_link[1]``) may be a function that gives them: the
    first round then finds the entities of its saturated links from the entity-major
    view (``ent_of_nz``: the entity of each nonzero), and the link-major view is built
    only if a second round needs it. A folded step's solve often freezes every entity
    in its first round, and then never sorts its nonzeros by link.
    """
    l_ptr, l_idx_or_build = by_link
    l_idx: NDArray[np.integer[Any]] | None = None if callable(l_idx_or_build) else l_idx_or_build
    ents: NDArray[np.integer[Any]]
    e_ptr, e_idx, e_val = by_ent
    rate = np.full(n_ent, np.inf)
    active = np.diff(e_ptr) > 0
    n_active = int(active.sum())
    if n_active == 0:
        return rate
    # Per link: the weight (flows) and count of active entities crossing it, and
    # the fill level at which it saturates if the active set stays as it is. As
    # the level rises every link's residual shrinks in proportion to its weight,
    # so a link's saturation level only moves when its weight does: each round
    # touches just the links of the entities it freezes.
    weight = weight.copy()
    count = np.diff(l_ptr).astype(np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        sat_level = np.where(count > 0, cap / weight, np.inf)
    level = 0.0
    inf = np.inf
    first = True
    while n_active:
        lowest = float(sat_level.min())
        if lowest == inf:
            rate[active] = inf
            break
        level = max(level, lowest)
        sat = np.flatnonzero(sat_level <= level * (1.0 + rtol))
        sat_level[sat] = inf
        if l_idx is None and ent_of_nz is not None and first:
            # The entities crossing a saturated link, read by entity: in the first round
            # every entity with a nonzero is active.
            first = False
            hit = np.zeros(weight.size, dtype=bool)
            hit[sat] = True
            crossing = np.zeros(n_ent, dtype=bool)
            crossing[ent_of_nz[hit[e_idx]]] = True
            ents = np.flatnonzero(crossing)
        else:
            if l_idx is None:
                assert callable(l_idx_or_build)
                l_idx = l_idx_or_build()
            ents = l_idx[_span(l_ptr, sat)]
            ents = ents[active[ents]]
            if ents.size >= n_ent:
                # np.unique without a sort: the links that saturate together can be
                # thousands for a few entities (a folded step's, of equal capacity and count).
                ents = np.flatnonzero(np.bincount(ents, minlength=n_ent))
            elif ents.size > 1:
                ents = np.unique(ents)
        rate[ents] = level
        active[ents] = False
        n_active -= ents.size
        if not n_active:
            break
        pos = _span(e_ptr, ents)
        # `links` may repeat a link; every copy reads the same old and new weight.
        links = e_idx[pos]
        w_old = weight[links]
        np.subtract.at(weight, links, e_val[pos])
        np.subtract.at(count, links, 1)
        old = sat_level[links]
        keep = (count[links] > 0) & (old < inf)
        moved = links[keep]
        sat_level[moved] = level + (old[keep] - level) * (w_old[keep] / weight[moved])
        sat_level[links[~keep]] = inf
    return rate


def _both_orientations(
    incidence: sp.csr_matrix | sp.csc_matrix | sp.csr_array | sp.csc_array,
) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """The incidence compressed by link (rows) and by entity (columns), without zeros.

    The caller's arrays may be shared, so zeros are dropped from a copy.
    """
    import scipy.sparse as sp

    if incidence.format == "csc":
        # The columns of a CSC matrix are the rows of its transpose: no sort needed.
        by_ent = sp.csr_matrix(
            (np.asarray(incidence.data, dtype=np.float64), incidence.indices, incidence.indptr),
            shape=incidence.shape[::-1],
        )
        by_ent = _without_zeros(by_ent)
        return sp.csr_matrix(by_ent.T), by_ent
    by_link = _without_zeros(sp.csr_matrix(incidence, dtype=np.float64))
    return by_link, sp.csr_matrix(by_link.T)


def _without_zeros(matrix: sp.csr_matrix) -> sp.csr_matrix:
    if matrix.nnz and not matrix.data.all():
        matrix = matrix.copy()
        matrix.eliminate_zeros()
    return matrix


def maxmin_rates_reference(
    incidence: sp.spmatrix | sp.sparray | NDArray[np.float64],
    capacity_Bps: NDArray[np.float64] | list[float],
    *,
    rtol: float = DEFAULT_RTOL,
) -> NDArray[np.float64]:
    """Progressive filling in plain Python over a dense copy: slow, and easy to check."""
    dense = incidence.toarray() if hasattr(incidence, "toarray") else np.asarray(incidence)
    table: list[list[float]] = [[float(x) for x in row] for row in dense]
    n_links = len(table)
    n_ent = len(table[0]) if table else dense.shape[1]
    cap = [float(c) for c in capacity_Bps]
    rem = list(cap)
    rate = [math.inf] * n_ent
    active = {e for e in range(n_ent) if any(table[link][e] > 0 for link in range(n_links))}
    level = 0.0
    while active:
        weights = [sum(table[link][e] for e in active) for link in range(n_links)]
        loaded = [link for link in range(n_links) if weights[link] > 0]
        shares = {link: rem[link] / weights[link] for link in loaded}
        delta = max(min(shares.values()), 0.0)
        level += delta
        saturated = []
        for link in loaded:
            rem[link] -= delta * weights[link]
            if shares[link] <= delta * (1 + rtol) or rem[link] <= rtol * cap[link]:
                saturated.append(link)
        for link in saturated:
            rem[link] = 0.0
            for e in list(active):
                if table[link][e] > 0:
                    rate[e] = level
                    active.discard(e)
    return np.asarray(rate, dtype=np.float64)


def with_ceilings(
    capped: NDArray[np.int64],
    ceilings: NDArray[np.float64],
    columns: tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]],
    capacity: NDArray[np.float64],
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64], NDArray[np.float64]]:
    """Rate ceilings as private links: the compressed columns (``nnz`` per entity,
    ``rows``, ``counts``, as :func:`maxmin_rates_csc` takes them) with one row of
    capacity ``ceilings[j]``, crossed once, for entity ``capped[j]`` (increasing). The
    rows are appended after ``capacity``'s, which keep their indices."""
    nnz, rows, counts = columns
    n0 = capacity.size
    starts = np.concatenate([[0], np.cumsum(nnz)])
    cols_rows: list[NDArray[np.int64]] = []
    cols_counts: list[NDArray[np.float64]] = []
    new_nnz = nnz.copy()
    extra = dict(zip(capped.tolist(), range(n0, n0 + capped.size), strict=True))
    for i in range(nnz.size):
        cols_rows.append(rows[starts[i] : starts[i + 1]])
        cols_counts.append(counts[starts[i] : starts[i + 1]])
        row = extra.get(i)
        if row is not None:
            cols_rows.append(np.asarray([row], dtype=np.int64))
            cols_counts.append(np.ones(1))
            new_nnz[i] += 1
    return (
        new_nnz,
        np.concatenate(cols_rows).astype(np.int64),
        np.concatenate(cols_counts),
        np.concatenate([capacity, ceilings]),
    )
