"""Per-link utilisation over time, accumulated sparsely for a topology heat map.

Between two solves of the flow model the load of every link is constant. A
:class:`LinkStats` is told the loaded links, their load and their capacity at
each solve (:meth:`LinkStats.set_loads`) and the intervals that pass
(:meth:`LinkStats.advance`). It accumulates, touching only the loaded links:

- ``bytes``: bytes carried by each link;
- ``busy_s``: the time integral of utilisation (load / current capacity), so
  ``busy_s / elapsed_s`` is the time-weighted mean utilisation;
- ``peak``: the highest utilisation seen;
- a time series: the utilisation integral per link and time bin. Within a bin
  nothing more is done; when time leaves a bin, the bin's integrals are
  ``busy_s`` minus its value when the bin opened, stored for the links that
  changed. An interval that spans whole bins is kept as one run. Bins start
  narrow and double in width (merging pairwise) whenever the run outgrows
  ``max_bins`` of them, so memory stays bounded by ``max_bins`` x the links
  loaded in each bin, whatever the horizon.

:meth:`LinkStats.summary` packs these into a :class:`LinkUtilisation`: plain
numpy arrays, no pandas, with the series of the most-loaded links.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["LinkStats", "LinkUtilisation"]

Floats = NDArray[np.float64]
Ints = NDArray[np.int64]


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


class LinkStats:
    """Sparse accumulators of per-link bytes, utilisation and a binned time series."""

    def __init__(self, n_links: int, *, start_s: float, max_bins: int = 64) -> None:
        if max_bins < 2:
            raise ValueError(f"max_bins must be at least 2 (got {max_bins})")
        self.n_links = n_links
        self.start_s = start_s
        self.end_s = start_s
        self.max_bins = max_bins
        self.bytes: Floats = np.zeros(n_links)
        self.busy_s: Floats = np.zeros(n_links)
        self.peak: Floats = np.zeros(n_links)
        self._links: Ints = np.zeros(0, dtype=np.int64)
        self._load: Floats = np.zeros(0)
        self._util: Floats = np.zeros(0)
        self._bin_s = 0.0
        self._cur = 0
        """The bin in progress; ``busy_s - _mark`` is what it has accumulated so far."""
        self._mark: Floats = np.zeros(n_links)
        self._touched: list[Ints] = []
        """Links whose ``busy_s`` moved in the bin in progress (arrays, may repeat)."""
        self._records: list[tuple[int, Ints, Floats]] = []
        """Finished bins: (bin, links, utilisation integral)."""
        self._runs: list[tuple[int, int, Ints, Floats]] = []
        """Whole bins ``[first, last)`` that one interval crossed: (first, last, links, util)."""

    def set_loads(self, links: Ints, load_Bps: Floats, capacity_Bps: Floats) -> None:
        """The loads from now on: ``load_Bps[i]`` on link ``links[i]`` of ``capacity_Bps[i]``."""
        self._links = links
        self._load = load_Bps
        self._util = np.divide(
            load_Bps, capacity_Bps, out=np.zeros(load_Bps.size), where=capacity_Bps > 0
        )
        if links.size:
            self.peak[links] = np.maximum(self.peak[links], self._util)

    def advance(self, t0_s: float, t1_s: float) -> None:
        """The current loads held from ``t0_s`` to ``t1_s``.

        Inside one time bin this only adds to ``bytes`` and ``busy_s``. When the
        interval leaves the bin in progress, the bin is closed: its integrals are
        ``busy_s`` minus their values when it opened, a sparse difference.
        """
        self.end_s = max(self.end_s, t1_s)
        dt = t1_s - t0_s
        links, util = self._links, self._util
        if dt <= 0 or not links.size:
            return
        self.bytes[links] += self._load * dt
        a, b = t0_s - self.start_s, t1_s - self.start_s
        if self._bin_s == 0.0:
            self._bin_s = max(b, 1e-12) / (self.max_bins // 2)
        while b > self._bin_s * self.max_bins:
            self._double()
        w = self._bin_s
        first = int(a // w)
        last = max(first, math.ceil(b / w) - 1)
        if first != self._cur:
            self._close()
            self._cur = first
        self._touch(links)
        if first == last:
            self.busy_s[links] += util * dt
            return
        self.busy_s[links] += util * ((first + 1) * w - a)
        self._close()
        self._touch(links)
        if last > first + 1:
            whole = util * ((last - first - 1) * w)
            self.busy_s[links] += whole
            self._mark[links] += whole  # kept as a run, not in the bin that follows
            self._runs.append((first + 1, last, links, util))
        self._cur = last
        self.busy_s[links] += util * (b - last * w)

    def _touch(self, links: Ints) -> None:
        """``busy_s`` of ``links`` changes in the bin in progress."""
        if not self._touched or self._touched[-1] is not links:
            self._touched.append(links)

    def _close(self) -> None:
        """Record what the bin in progress accumulated (over the links it touched only:
        a cluster of 10^6 chips has millions of links, a bin a few thousand)."""
        if not self._touched:
            return
        links = np.unique(np.concatenate(self._touched))
        self._touched = []
        diff = self.busy_s[links] - self._mark[links]
        moved = diff != 0
        if moved.any():
            links = links[moved]
            self._records.append((self._cur, links, diff[moved]))
            self._mark[links] = self.busy_s[links]

    def _double(self) -> None:
        """Double the bin width: merge bins pairwise and turn runs into bin records."""
        n = self.n_links
        keys = [b // 2 * n + links for b, links, _ in self._records]
        vals = [v for _, _, v in self._records]
        for first, last, links, util in self._runs:
            for j in range(first // 2, (last - 1) // 2 + 1):
                covered = min(last, 2 * j + 2) - max(first, 2 * j)
                keys.append(j * n + links)
                vals.append(util * (covered * self._bin_s))
        self._bin_s *= 2.0
        self._cur //= 2
        self._runs = []
        self._records = []
        if keys:
            merged, sums = _sum_by_key(np.concatenate(keys), np.concatenate(vals))
            bins = merged // n
            cuts = np.flatnonzero(np.diff(bins)) + 1
            for k, v in zip(np.split(merged, cuts), np.split(sums, cuts), strict=True):
                self._records.append((int(k[0] // n), k % n, v))

    @property
    def elapsed_s(self) -> float:
        return self.end_s - self.start_s

    def mean(self) -> Floats:
        """Time-weighted mean utilisation of each link."""
        elapsed = self.elapsed_s
        out: Floats = self.busy_s / elapsed if elapsed > 0 else np.zeros(self.n_links)
        return out

    def series(self, links: Ints) -> tuple[Floats, Floats]:
        """Bin edges, and the mean utilisation of each of ``links`` per bin (links x bins)."""
        if not self._bin_s:
            return np.asarray([self.start_s, self.end_s]), np.zeros((links.size, 1))
        while self.elapsed_s > self._bin_s * self.max_bins:
            self._double()
        w = self._bin_s
        n_bins = max(1, min(self.max_bins, math.ceil(self.elapsed_s / w - 1e-9)))
        edges: Floats = self.start_s + np.arange(n_bins + 1, dtype=np.float64) * w
        out = np.zeros((links.size, n_bins))
        row = np.full(self.n_links, -1, dtype=np.int64)
        row[links] = np.arange(links.size)
        for b, those, vals in [
            *self._records,
            (self._cur, links, self.busy_s[links] - self._mark[links]),
        ]:
            rows = row[those]
            mine = rows >= 0
            if b < n_bins:
                out[rows[mine], b] += vals[mine]
        for first, last, those, util in self._runs:
            rows = row[those]
            mine = rows >= 0
            out[rows[mine], first : min(last, n_bins)] += util[mine, None] * w
        series: Floats = out / w
        return edges, series

    def summary(
        self,
        names: NDArray[np.str_],
        kinds: NDArray[np.str_],
        capacity_Bps: Floats,
        top: int = 8,
    ) -> LinkUtilisation:
        mean = self.mean()
        loaded = np.flatnonzero(self.busy_s > 0)
        order = loaded[np.argsort(-mean[loaded], kind="stable")][:top]
        edges, series = self.series(order)
        return LinkUtilisation(
            names=names,
            kinds=kinds,
            capacity_Bps=capacity_Bps.copy(),
            bytes=self.bytes.copy(),
            mean=mean,
            peak=self.peak.copy(),
            elapsed_s=self.elapsed_s,
            top=order.astype(np.int64),
            edges_s=edges,
            series=series,
        )


def _sum_by_key(keys: Ints, vals: Floats) -> tuple[Ints, Floats]:
    """Unique keys and the sum of the values of each."""
    if not keys.size:
        return keys, vals
    uniq, inverse = np.unique(keys, return_inverse=True)
    sums: Floats = np.bincount(inverse.ravel(), weights=vals, minlength=uniq.size).astype(
        np.float64
    )
    return uniq, sums
