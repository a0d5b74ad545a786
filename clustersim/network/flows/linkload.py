"""What the link statistics read and give (:mod:`.linkstats`): the routed columns of a
load pattern, and the utilisation summary of a run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

__all__ = ["Column", "LinkUtilisation", "LoadPattern"]

Floats = NDArray[np.float64]
Ints = NDArray[np.int64]
_NONE: Ints = np.zeros(0, dtype=np.int64)
_NO_UTIL: Floats = np.zeros(0)


class Column(Protocol):
    """A routed group as the statistics see it (a :class:`~.entity.FlowGroup`)."""

    @property
    def links(self) -> Ints:
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
        shared: Ints = _NONE,
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
