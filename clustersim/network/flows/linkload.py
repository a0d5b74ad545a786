"""What the link statistics read and give (:mod:`.linkstats`): the routed columns of a
load pattern, and the utilisation summary of a run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from clustersim.network.flows.entity import LinkIds

__all__ = [
    "Column",
    "LinkUtilisation",
    "LoadPattern",
    "PendingMax",
    "max_by_link",
    "sum_by_link",
    "take_row",
]

Floats = NDArray[np.float64]
Ints = NDArray[np.int64]
_NONE: Ints = np.zeros(0, dtype=np.int64)
_NO_UTIL: Floats = np.zeros(0)


class Column(Protocol):
    """A routed group as the statistics see it (a :class:`~.entity.FlowGroup`)."""

    @property
    def links(self) -> LinkIds:
        """Distinct link indices, increasing (indices past the topology's are not links:
        shared HBM rows)."""
        ...

    @property
    def counts(self) -> Floats:
        """The flows crossing each of ``links``."""
        ...


@dataclass(frozen=True)
class LinkUtilisation:
    """Utilisation of every link over a run, and a time series of the busiest ones.

    ``names``, ``kinds``, ``capacity_Bps``, ``bytes``, ``mean`` and ``peak`` have
    one entry per link: ``mean`` is the time-weighted mean of load / capacity over
    ``elapsed_s``, ``peak`` its maximum. ``top`` holds the indices of the
    most-loaded links (by mean utilisation) and ``series[i, b]`` the mean
    utilisation of link ``top[i]`` in the time bin ``[edges_s[b], edges_s[b+1])``.
    """

    names: NDArray[np.str_]
    kinds: NDArray[np.str_]
    capacity_Bps: Floats
    bytes: Floats
    mean: Floats
    peak: Floats
    elapsed_s: float
    top: Ints
    edges_s: Floats
    series: Floats


class LoadPattern:
    """Column ``columns[i]`` carrying ``rates[i]`` per unit count; ``shared`` are the links
    (distinct) that several columns load, with their utilisation ``shared_util``."""

    __slots__ = ("columns", "peaked", "rates", "shared", "shared_util")

    def __init__(
        self,
        columns: Sequence[Column],
        rates: Sequence[float],
        shared: LinkIds = _NONE,
        shared_util: Floats = _NO_UTIL,
    ) -> None:
        self.columns = tuple(columns)
        self.rates = tuple(float(r) for r in rates)
        self.shared = shared
        self.shared_util = shared_util
        self.peaked = False
        """Whether ``peak`` has seen this pattern."""

    @property
    def size(self) -> int:
        """Link entries the pattern holds of its own (its columns belong to their groups)."""
        return int(self.shared.size) + len(self.columns)


Pieces = list[tuple[Ints, Floats]]
"""Values on links: ``(links, values)`` pairs, each with distinct links."""


def take_row(row: Floats) -> tuple[Ints, Floats]:
    """The links where ``row`` is not zero (sorted) and its values there; ``row`` is all
    zero again after."""
    links = np.flatnonzero(row).astype(np.int64)
    vals = row[links]
    row[links] = 0.0
    return links, vals


def sum_by_link(pieces: Pieces, n_links: int) -> tuple[Ints, Floats]:
    """The links of ``pieces`` (of ``n_links``), sorted, and the sum of their values on
    each (added in the order of ``pieces``)."""
    if len(pieces) == 1:
        return pieces[0]
    size = sum(links.size for links, _ in pieces)
    if size > n_links // 8:  # a dense row of the links, not a sort of every entry
        row = np.zeros(n_links)
        for links, vals in pieces:
            row[links] += vals
        return take_row(row)
    keys = np.concatenate([links for links, _ in pieces])
    vals = np.concatenate([vals for _, vals in pieces])
    if not keys.size:
        return keys, vals
    uniq, inverse = np.unique(keys, return_inverse=True)
    sums: Floats = np.bincount(inverse.ravel(), weights=vals, minlength=uniq.size).astype(
        np.float64
    )
    return uniq.astype(np.int64), sums


def max_by_link(pieces: list[tuple[LinkIds, Floats]]) -> tuple[Ints, Floats]:
    """The links of ``pieces``, sorted, and the highest of their values on each."""
    every = np.concatenate([links for links, _ in pieces]).astype(np.int64, copy=False)
    values = np.concatenate([vals for _, vals in pieces])
    order = np.argsort(every, kind="stable")
    every, values = every[order], values[order]
    starts = np.flatnonzero(np.concatenate([[True], every[1:] != every[:-1]]))
    return every[starts], np.maximum.reduceat(values, starts)


class PendingMax:
    """Values on links whose highest per link is wanted, kept as ``(links, values)``
    pairs until read (a maximum: any order gives the same), merged into one pair per
    link when they pass a quarter of the ``n_links`` links."""

    def __init__(self, n_links: int) -> None:
        self.n_links = n_links
        self.pieces: list[tuple[LinkIds, Floats]] = []
        self.size = 0

    def add(self, links: LinkIds, values: Floats) -> bool:
        """Keep ``values`` on ``links``; whether they would better be spread over an
        array of every link (an eighth of the links, merged)."""
        self.pieces.append((links, values))
        self.size += int(links.size)
        if self.size <= self.n_links // 4:
            return False
        self.pieces = [max_by_link(self.pieces)]
        self.size = int(self.pieces[0][0].size)
        return self.size > self.n_links // 8

    def spread(self, into: Floats) -> None:
        """Raise ``into`` (one value per link) to the values kept, and forget them."""
        for links, values in self.pieces:
            into[links] = np.maximum(into[links], values)
        self.pieces, self.size = [], 0
