"""Max-min rates of the entities of one component of the flow model (:mod:`.flows`)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from clustersim.errors import SimulationError
from clustersim.network.entity import FlowGroup
from clustersim.network.linkstats import LoadPattern
from clustersim.network.maxmin import maxmin_rates_csc, with_ceilings

__all__ = ["Solved", "solve_groups"]

Solved = tuple[NDArray[np.float64], LoadPattern]
"""The rates of a component's entities, and the loads they put on its links."""


def solve_groups(
    groups: tuple[FlowGroup, ...],
    cap: NDArray[np.float64],
    hbm_base: int | None,
    names: Callable[[NDArray[np.int64]], list[str]],
) -> Solved:
    """Max-min rates of entities routed as ``groups`` over capacities ``cap``, with their
    links' loads; ``hbm_base`` is the first HBM index when HBM is shared (left out of the
    loads), ``names`` names links in errors.

    An entity alone on its links runs at the rate of its tightest link.
    """
    capped = [i for i, g in enumerate(groups) if g.rate_cap_Bps < math.inf]
    if len(groups) == 1 and groups[0].links.size:
        (g,) = groups
        cap_nz = cap[g.links]
        rate = min(float((cap_nz / g.counts).min()), g.rate_cap_Bps)
        rates = np.asarray([rate])
        out: Solved = (rates, _pattern(hbm_base, g.links, g.counts * rate, cap_nz))
    else:
        nnz = np.asarray([g.links.size for g in groups], dtype=np.int64)
        counts = np.concatenate([g.counts for g in groups])
        loaded, rows = np.unique(np.concatenate([g.links for g in groups]), return_inverse=True)
        rows = rows.ravel()
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
        load = np.bincount(rows, weights=counts * np.repeat(rates, nnz), minlength=capacity.size)
        load = load[: loaded.size]
        out = (
            rates,
            _pattern(
                hbm_base, loaded.astype(np.int64), load.astype(np.float64), capacity[: loaded.size]
            ),
        )
    # Rate 0 is a stall: a link on the route has failed and routing has not
    # noticed yet (capacity factor 0, see LinkTable.set_capacity_factor).
    if not (rates.min() >= 0 and np.isfinite(rates).all()):
        bad = int(np.argmin(rates)) if rates.min() < 0 else int(np.argmax(~np.isfinite(rates)))
        raise SimulationError(
            f"transfer over links {names(groups[bad].links)} got rate {rates[bad]}: "
            "a link on its route has no capacity"
        )
    return out


def _pattern(
    hbm_base: int | None,
    links: NDArray[np.int64],
    load: NDArray[np.float64],
    capacity: NDArray[np.float64],
) -> LoadPattern:
    """The load on the topology's links (HBM is left out of the link statistics)."""
    if hbm_base is not None and links.size and links[-1] >= hbm_base:
        keep = links < hbm_base
        return LoadPattern(links[keep], load[keep], capacity[keep])
    return LoadPattern(links, load, capacity)
