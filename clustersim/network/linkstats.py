"""Per-link utilisation over time, accumulated sparsely for a topology heat map.

The flow model's loads come in *patterns*: one solve of one component of the
model loads a set of links (:class:`LoadPattern`), and holds until that component
changes. A :class:`LinkStats` is told which pattern each component holds from
when (:meth:`LinkStats.hold`); it adds up, per pattern, the time it was held in
the time bin in progress, and only when time leaves the bin does it spread the
patterns over their links. A pattern that recurs (the same collective in every
microbatch) is spread once per bin, however often it was held: the cost of a
change of load is a dictionary update, not work per link. It accumulates:

- ``bytes``: bytes carried by each link;
- ``busy_s``: the time integral of utilisation (load / current capacity), so
  ``busy_s / elapsed_s`` is the time-weighted mean utilisation;
- ``peak``: the highest utilisation seen;
- a time series: the utilisation integral per link and time bin. When time
  leaves a bin, the bin's integrals are ``busy_s`` minus its value when the bin
  opened, stored for the links that changed. An interval that spans whole bins
  is kept as one run. Bins start narrow and double in width (merging pairwise)
  whenever the run outgrows ``max_bins`` of them, so memory stays bounded by
  ``max_bins`` x the links loaded in each bin, whatever the horizon.

:meth:`LinkStats.summary` packs these into a :class:`LinkUtilisation`: plain
numpy arrays, no pandas, with the series of the most-loaded links.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["LinkStats", "LinkUtilisation", "LoadPattern"]

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


class LoadPattern:
    """``load_Bps[i]`` on link ``links[i]`` (distinct) of capacity ``capacity_Bps[i]``."""

    __slots__ = ("links", "load", "peaked", "util")

    def __init__(self, links: Ints, load_Bps: Floats, capacity_Bps: Floats) -> None:
        self.links = links
        self.load = load_Bps
        self.util: Floats = np.divide(
            load_Bps, capacity_Bps, out=np.zeros(load_Bps.size), where=capacity_Bps > 0
        )
        self.peaked = False
        """Whether ``peak`` has seen this pattern."""


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
        self._held: dict[int, tuple[LoadPattern, float]] = {}
        """The pattern each holder holds now, and since when (not yet added)."""
        self._acc: dict[int, tuple[LoadPattern, float]] = {}
        """Seconds each pattern was held in the bin in progress, not yet spread (by id)."""
        self._bin_s = 0.0
        self._cur = 0
        """The bin in progress; ``busy_s - _mark`` is what it has accumulated so far."""
        self._mark: Floats = np.zeros(n_links)
        self._touched: list[Ints] = []
        """Links whose ``busy_s`` moved in the bin in progress (arrays, may repeat)."""
        self._seen = np.zeros(n_links, dtype=bool)
        """Scratch marks of the touched links (all False between bins)."""
        self._records: list[tuple[int, Ints, Floats]] = []
        """Finished bins: (bin, links, utilisation integral)."""
        self._runs: list[tuple[int, int, Ints, Floats]] = []
        """Whole bins ``[first, last)`` that one interval crossed: (first, last, links, util)."""

    def hold(self, holder: int, now_s: float, pattern: LoadPattern | None) -> None:
        """From ``now_s`` on, ``holder`` loads the links as ``pattern`` (None: no more).

        A holder is one component of the flow model; the patterns of different
        holders load different links. Times never go backwards.
        """
        self.advance_to(now_s)
        old = self._held.pop(holder, None)
        if old is not None:
            self._add(old[0], now_s - old[1])
        if pattern is None:
            return
        if not pattern.peaked:
            pattern.peaked = True
            links = pattern.links
            self.peak[links] = np.maximum(self.peak[links], pattern.util)
        self._held[holder] = (pattern, now_s)

    def load(self) -> Floats:
        """The load of each link now (bytes per second)."""
        out: Floats = np.zeros(self.n_links)
        for pattern, _ in self._held.values():
            out[pattern.links] += pattern.load
        return out

    def grow(self, n_links: int) -> None:
        """The topology gained links: extend the per-link arrays (the new links idle)."""
        extra = n_links - self.n_links
        if extra <= 0:
            return
        for name in ("bytes", "busy_s", "peak", "_mark"):
            setattr(self, name, np.concatenate([getattr(self, name), np.zeros(extra)]))
        self._seen = np.concatenate([self._seen, np.zeros(extra, dtype=bool)])
        self.n_links = n_links

    def advance_to(self, now_s: float) -> None:
        """Time has reached ``now_s``: close the bins it left."""
        if now_s <= self.end_s:
            return
        if not self._bin_s:
            if not (self._held or self._acc):
                self.end_s = now_s
                return
            # The first interval with a load sets the width: it spans half the bins,
            # and the bin in progress is the one it started in.
            self._bin_s = max(now_s - self.start_s, 1e-12) / (self.max_bins // 2)
            first = min([since for _, since in self._held.values()], default=self.end_s)
            self._cur = int((first - self.start_s) // self._bin_s)
        self.end_s = now_s
        b = now_s - self.start_s
        while b > self._bin_s * self.max_bins:
            self._double()
        w = self._bin_s
        last = max(self._cur, math.ceil(b / w) - 1)
        if last == self._cur:
            return
        self._settle(self.start_s + (self._cur + 1) * w)
        self._close()
        whole = (last - self._cur - 1) * w
        for pattern, _ in self._held.values() if whole > 0 else ():
            links, busy = pattern.links, pattern.util * whole
            self.busy_s[links] += busy
            self._mark[links] += busy  # kept as a run, not in the bin that follows
            self.bytes[links] += pattern.load * whole
            self._runs.append((self._cur + 1, last, links, pattern.util))
        t_s = self.start_s + last * w
        self._held = {h: (pattern, t_s) for h, (pattern, _) in self._held.items()}
        self._cur = last

    def settle(self) -> None:
        """Spread everything held up to now (``end_s``) over the links, for reading them."""
        self._settle(self.end_s)

    def _settle(self, t_s: float) -> None:
        """Add the patterns held up to ``t_s`` and spread what the bin holds."""
        for pattern, since in self._held.values():
            self._add(pattern, t_s - since)
        self._held = {h: (pattern, t_s) for h, (pattern, _) in self._held.items()}
        for pattern, seconds in self._acc.values():
            links = pattern.links
            self.bytes[links] += pattern.load * seconds
            self.busy_s[links] += pattern.util * seconds
            self._touch(links)
        self._acc = {}

    def _add(self, pattern: LoadPattern, seconds: float) -> None:
        """``pattern`` was held for ``seconds`` more in the bin in progress."""
        if seconds <= 0:
            return
        key = id(pattern)  # the entry holds the pattern, so its id is not reused
        found = self._acc.get(key)
        self._acc[key] = (pattern, seconds if found is None else found[1] + seconds)

    def _touch(self, links: Ints) -> None:
        """``busy_s`` of ``links`` changes in the bin in progress."""
        if not self._touched or self._touched[-1] is not links:
            self._touched.append(links)

    def _close(self) -> None:
        """Record what the bin in progress accumulated (over the links it touched only:
        a cluster of 10^6 chips has millions of links, a bin a few thousand)."""
        if not self._touched:
            return
        # Patterns recur within a bin: each array of links once.
        arrays = list({id(a): a for a in self._touched}.values())
        self._touched = []
        if sum(a.size for a in arrays) > self.n_links // 64:
            # Many touches (a bin of thousands of transfers, or the hundreds of
            # thousands of links of each folded step at 10^6 chips): marks, not a sort.
            seen = self._seen
            for touched in arrays:
                seen[touched] = True
            links = np.flatnonzero(seen)
            seen[links] = False
        else:
            links = np.unique(np.concatenate(arrays))
        diff = self.busy_s[links] - self._mark[links]
        moved = diff != 0
        if moved.any():
            links = links[moved]
            self._records.append((self._cur, links, diff[moved]))
            self._mark[links] = self.busy_s[links]

    def _double(self) -> None:
        """Double the bin width: merge bins pairwise and turn runs into bin records."""
        pieces: dict[int, list[tuple[Ints, Floats]]] = {}
        for b, links, vals in self._records:
            pieces.setdefault(b // 2, []).append((links, vals))
        for first, last, links, util in self._runs:
            for j in range(first // 2, (last - 1) // 2 + 1):
                covered = min(last, 2 * j + 2) - max(first, 2 * j)
                pieces.setdefault(j, []).append((links, util * (covered * self._bin_s)))
        self._bin_s *= 2.0
        self._cur //= 2
        self._runs = []
        self._records = [(j, *self._sum_by_link(pieces[j])) for j in sorted(pieces)]

    def _sum_by_link(self, pieces: list[tuple[Ints, Floats]]) -> tuple[Ints, Floats]:
        """The links of ``pieces`` (each with distinct links), sorted, and the sum of their
        values on each, added in the order of the pieces."""
        if len(pieces) == 1:
            return pieces[0]
        if sum(links.size for links, _ in pieces) <= self.n_links // 64:
            return _sum_by_key(
                np.concatenate([links for links, _ in pieces]),
                np.concatenate([vals for _, vals in pieces]),
            )
        # Many links (each bin of a folded step at 10^6 chips): a dense sum, not a sort.
        seen, total = self._seen, np.zeros(self.n_links)
        for links, vals in pieces:
            seen[links] = True
            total[links] += vals
        links = np.flatnonzero(seen)
        seen[links] = False
        return links, total[links]

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
        self.settle()
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
