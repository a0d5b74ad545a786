"""Per-link utilisation over time, accumulated per routed column for a topology heat map.

The flow model's loads come in *patterns*: one solve of one component of the
model loads the links of its entities' groups, and holds until that component
changes. A pattern is a few *columns* (the component's distinct routed groups,
each ``links`` with flow ``counts``) and the rate of each (the sum of its
entities' rates): column ``i`` puts ``counts_i x rates[i]`` on its links. A
:class:`LinkStats` is told which pattern each component holds from when
(:meth:`LinkStats.hold`), and adds up, per column, the integral of its rate over
time (byte-seconds per unit count). Nothing is spread over links while the run
goes on: a change of load is a few dictionary updates, whatever the number of
links its groups cross (a folded step at 10^6 chips crosses 10^5 to 10^6).

Loads are linear in the columns' rates, so every per-link figure is the sum of
its columns' integrals times their counts, worked out when it is read
(:meth:`LinkStats.settle`):

- ``bytes``: bytes carried by each link;
- ``busy_s``: the time integral of utilisation (load / capacity), so ``busy_s /
  elapsed_s`` is the time-weighted mean utilisation; capacities change only at
  :meth:`LinkStats.set_capacity` (a link or lane failing or recovering), which
  closes an *epoch* of constant capacities;
- ``peak``: the highest utilisation seen. On a link that one column of a pattern
  loads alone its utilisation is ``counts x rate / capacity``, so the column's
  highest rate in the epoch gives the peak there; the links that several columns
  of a pattern share are few, and each pattern brings their utilisation
  (``shared``, ``shared_util``), taken the first time it is held;
- a time series: each column's integral per time bin. Bins start narrow and
  double in width (merging pairwise) whenever the run outgrows ``max_bins`` of
  them; a hold that spans whole bins is kept as one run. The series of a link is
  read off the columns that cross it (:meth:`LinkStats.series`, for the few
  busiest links of :meth:`LinkStats.summary`).

The bins keep their columns alive (the routing caches hold most of them anyway).
When the columns they hold pass as many link entries as per-link records of half
the bins over every link would (:attr:`LinkStats.max_pinned_links`), the bins are
spread over their links as such records, and the columns released.

The sums are those of a per-link accumulation in another order: equal to
rounding. :meth:`LinkStats.summary` packs them into a :class:`LinkUtilisation`:
plain numpy arrays, no pandas, with the series of the most-loaded links.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from clustersim.network.flows.entity import LinkIds
from clustersim.network.flows.linkload import (
    Column,
    LinkUtilisation,
    LoadPattern,
    PendingMax,
    sum_by_link,
    take_row,
)

__all__ = ["Column", "LinkStats", "LinkUtilisation", "LoadPattern"]

Floats = NDArray[np.float64]
Ints = NDArray[np.int64]


class _Sum:
    """A column and a figure of it (an integral, or a highest rate)."""

    __slots__ = ("col", "value")

    def __init__(self, col: Column, value: float) -> None:
        self.col = col
        self.value = value


_Acc = dict[int, _Sum]
"""Per column (by id; the entry holds the column, so its id is not reused)."""


def _accumulate(sums: _Acc, pattern: LoadPattern, seconds: float) -> None:
    """Add each of ``pattern``'s columns' rate held for ``seconds`` to ``sums``."""
    for col, rate in zip(pattern.columns, pattern.rates, strict=True):
        found = sums.get(id(col))
        if found is None:
            sums[id(col)] = _Sum(col, rate * seconds)
        else:
            found.value += rate * seconds


class LinkStats:
    """Accumulators of per-link bytes, utilisation and a binned time series, per column."""

    max_pinned_links: int | None = None
    """Link entries of the columns the bins may hold before they are spread over links
    (default: ``max_bins x n_links / 2``, and at least 2^24)."""

    def __init__(
        self,
        n_links: int,
        *,
        start_s: float,
        max_bins: int = 64,
        capacity_Bps: Floats | None = None,
    ) -> None:
        if max_bins < 2:
            raise ValueError(f"max_bins must be at least 2 (got {max_bins})")
        self.n_links = n_links
        self.start_s = start_s
        self.end_s = start_s
        self.max_bins = max_bins
        self._bytes: Floats | None = None
        self._busy_s: Floats | None = None
        self._peak: Floats | None = None
        """The per-link figures, made at their first use: a run that never reads them
        (a benchmark) holds no array over every link (10^7 links at a million chips)."""
        self._peaks = PendingMax(n_links)
        """Utilisations of shared links not yet in ``peak``."""
        self._held: dict[int, tuple[LoadPattern, float]] = {}
        """The pattern each holder holds now, and since when (not yet added)."""
        self._total: _Acc = {}
        """Each column's integral not yet spread over its links."""
        self._rmax: _Acc = {}
        """Each column's highest rate in the epoch, not yet in ``peak``."""
        self._acc: _Acc = {}
        """Each column's integral in the bin in progress."""
        self._bin_s = 0.0
        self._cur = 0
        self._records: list[tuple[int, int, _Acc]] = []
        """Finished bins: (bin, epoch, each column's integral)."""
        self._runs: list[tuple[int, int, int, LoadPattern]] = []
        """Whole bins ``[first, last)`` that one hold crossed: (first, last, epoch, pattern)."""
        self._spread: list[tuple[int, Ints, Floats]] = []
        """Bins spread over their links: (bin, links, utilisation integral)."""
        self._pinned: dict[int, int] = {}
        """Link entries of each column the bins hold (by id)."""
        self._pinned_links = 0
        self._caps: list[Floats] = []
        """The capacities of each epoch (a copy each)."""
        self._inv_now: Floats | None = None
        """1 / capacity of the epoch in progress (0 where a link has none), made when
        first read."""
        self.set_capacity(np.ones(n_links) if capacity_Bps is None else capacity_Bps)

    # -- loads ------------------------------------------------------------------------------

    # -- per-link figures -------------------------------------------------------------------

    @property
    def bytes(self) -> Floats:
        """Bytes carried by each link (as of the last :meth:`settle`)."""
        if self._bytes is None:
            self._bytes = np.zeros(self.n_links)
        return self._bytes

    @property
    def busy_s(self) -> Floats:
        """The time integral of each link's utilisation (as of the last :meth:`settle`)."""
        if self._busy_s is None:
            self._busy_s = np.zeros(self.n_links)
        return self._busy_s

    @property
    def peak(self) -> Floats:
        """The highest utilisation of each link seen (as of the last :meth:`settle`)."""
        if self._peak is None:
            self._peak = np.zeros(self.n_links)
        self._peaks.spread(self._peak)
        return self._peak

    @property
    def _inv(self) -> Floats:
        if self._inv_now is None:
            cap = self._caps[-1]
            inv = np.zeros(self.n_links)
            np.divide(1.0, cap, out=inv, where=cap > 0)
            self._inv_now = inv
        return self._inv_now

    # -- loads ------------------------------------------------------------------------------

    def set_capacity(self, capacity_Bps: Floats) -> None:
        """Capacities from now on (call after :meth:`advance_to` the instant they change).

        A read-only array of every link's capacity is held as it is (nobody changes it);
        any other is copied.
        """
        cap = np.asarray(capacity_Bps, dtype=np.float64).reshape(-1)
        if cap.flags.writeable or cap.size != self.n_links:
            cap = np.array(cap[: self.n_links], copy=True)
        if cap.size < self.n_links:
            cap = np.concatenate([cap, np.zeros(self.n_links - cap.size)])
        if self._caps:
            self._settle(self.end_s)
            self._flush()
            if self._acc:  # the bin in progress goes on in another epoch
                self._close()
        self._caps.append(cap)
        self._inv_now = None

    def hold(self, holder: int, now_s: float, pattern: LoadPattern | None) -> None:
        """From ``now_s`` on, ``holder`` loads the links as ``pattern`` (None: no more).

        A holder is one component of the flow model. Times never go backwards.
        """
        self.advance_to(now_s)
        old = self._held.pop(holder, None)
        if old is not None:
            self._add(old[0], now_s - old[1])
        if pattern is None:
            return
        if not pattern.peaked:
            pattern.peaked = True
            rmax = self._rmax
            for col, rate in zip(pattern.columns, pattern.rates, strict=True):
                found = rmax.get(id(col))
                if found is None:
                    rmax[id(col)] = _Sum(col, rate)
                elif rate > found.value:
                    found.value = rate
            shared = pattern.shared
            if shared.size and self._peak is not None:
                # Raised in place once the array exists: a maximum is the same in any order.
                self._peak[shared] = np.maximum(self._peak[shared], pattern.shared_util)
            elif shared.size and self._peaks.add(shared, pattern.shared_util):
                self._peak = self.peak  # they would fill an array over the links
        self._held[holder] = (pattern, now_s)

    def load(self) -> Floats:
        """The load of each link now (bytes per second)."""
        out: Floats = np.zeros(self.n_links)
        for pattern, _ in self._held.values():
            for col, rate in zip(pattern.columns, pattern.rates, strict=True):
                links, counts = self._within(col)
                out[links] += counts * rate
        return out

    def grow(self, n_links: int) -> None:
        """The topology gained links: extend the per-link arrays (the new links idle)."""
        extra = n_links - self.n_links
        if extra <= 0:
            return
        for name in ("_bytes", "_busy_s", "_peak", "_inv_now"):
            old = getattr(self, name)
            if old is not None:
                setattr(self, name, np.concatenate([old, np.zeros(extra)]))
        self._caps[-1] = np.concatenate([self._caps[-1], np.zeros(extra)])
        self.n_links = n_links

    # -- time -------------------------------------------------------------------------------

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
        epoch = len(self._caps) - 1
        for pattern, _ in self._held.values() if whole > 0 else ():
            self._add_total(pattern, whole)
            self._runs.append((self._cur + 1, last, epoch, pattern))
            self._pin(pattern.columns)
        t_s = self.start_s + last * w
        self._held = {h: (pattern, t_s) for h, (pattern, _) in self._held.items()}
        self._cur = last
        budget = self.max_pinned_links
        if budget is None:
            budget = max(1 << 24, self.max_bins * self.n_links // 2)
        if self._pinned_links > budget:
            self._spread_bins()

    def settle(self) -> None:
        """Spread everything held up to now (``end_s``) over the links, for reading them."""
        self._settle(self.end_s)
        self._flush()

    def _settle(self, t_s: float) -> None:
        """Add the patterns held up to ``t_s``."""
        for pattern, since in self._held.values():
            self._add(pattern, t_s - since)
        self._held = {h: (pattern, t_s) for h, (pattern, _) in self._held.items()}

    def _add(self, pattern: LoadPattern, seconds: float) -> None:
        """``pattern`` was held for ``seconds`` more in the bin in progress."""
        if seconds <= 0:
            return
        _accumulate(self._acc, pattern, seconds)
        self._add_total(pattern, seconds)

    def _add_total(self, pattern: LoadPattern, seconds: float) -> None:
        _accumulate(self._total, pattern, seconds)

    def _within(self, col: Column) -> tuple[LinkIds, Floats]:
        """The entries of ``col`` on links (not past them: HBM rows)."""
        links = col.links
        if links.size and links[-1] >= self.n_links:
            at = int(np.searchsorted(links, self.n_links))
            return links[:at], col.counts[:at]
        return links, col.counts

    def _flush(self) -> None:
        """Spread the columns' integrals and highest rates over their links."""
        if not (self._total or self._rmax):
            return
        inv = self._inv
        for item in self._total.values():
            links, counts = self._within(item.col)
            moved = counts * item.value
            self.bytes[links] += moved
            self.busy_s[links] += moved * inv[links]
        self._total = {}
        for item in self._rmax.values():
            links, counts = self._within(item.col)
            self.peak[links] = np.maximum(self.peak[links], counts * item.value * inv[links])
        self._rmax = {}

    def _close(self) -> None:
        """Record what the bin in progress accumulated."""
        if not self._acc:
            return
        self._records.append((self._cur, len(self._caps) - 1, self._acc))
        self._pin([item.col for item in self._acc.values()])
        self._acc = {}

    def _pin(self, columns: Sequence[Column]) -> None:
        pinned = self._pinned
        for col in columns:
            if id(col) not in pinned:
                size = int(col.links.size)
                pinned[id(col)] = size
                self._pinned_links += size

    # -- bins -------------------------------------------------------------------------------

    def _bins(self) -> dict[int, list[tuple[int, Column, float]]]:
        """Each closed bin's (epoch, column, integral), runs cut into their bins."""
        pieces: dict[int, list[tuple[int, Column, float]]] = {}
        for b, epoch, acc in self._records:
            part = pieces.setdefault(b, [])
            part.extend((epoch, item.col, item.value) for item in acc.values())
        w = self._bin_s
        for first, last, epoch, pattern in self._runs:
            for j in range(first, last):
                part = pieces.setdefault(j, [])
                part.extend(
                    (epoch, col, rate * w)
                    for col, rate in zip(pattern.columns, pattern.rates, strict=True)
                )
        return pieces

    def _double(self) -> None:
        """Double the bin width: merge bins pairwise (runs become bin records)."""
        merged: dict[int, dict[int, _Acc]] = {}
        for b, parts in self._bins().items():
            by_epoch = merged.setdefault(b // 2, {})
            for epoch, col, integral in parts:
                acc = by_epoch.setdefault(epoch, {})
                found = acc.get(id(col))
                if found is None:
                    acc[id(col)] = _Sum(col, integral)
                else:
                    found.value += integral
        spread: dict[int, list[tuple[Ints, Floats]]] = {}
        for b, links, vals in self._spread:
            spread.setdefault(b // 2, []).append((links, vals))
        self._bin_s *= 2.0
        self._cur //= 2
        self._runs = []
        self._records = [
            (j, epoch, acc) for j in sorted(merged) for epoch, acc in sorted(merged[j].items())
        ]
        self._spread = [(j, *sum_by_link(spread[j], self.n_links)) for j in sorted(spread)]

    def _spread_bins(self) -> None:
        """Spread the closed bins over their links (utilisation integrals per link), and
        release their columns. One bin at a time, through one dense row of the links:
        however many columns the bins hold, the work is their entries plus a pass over
        the links per bin, and it holds one bin's figures at a time besides."""
        spread: dict[int, list[tuple[Ints, Floats]]] = {}
        for b, links, vals in self._spread:
            spread.setdefault(b, []).append((links, vals))
        bins = self._bins()
        invs: dict[int, Floats] = {}
        row = np.zeros(self.n_links)
        out: list[tuple[int, Ints, Floats]] = []
        for b in sorted(spread.keys() | bins.keys()):
            for links, vals in spread.get(b, ()):
                row[links] += vals
            for epoch, col, integral in bins.get(b, ()):
                inv = invs.get(epoch)
                if inv is None:
                    inv = invs[epoch] = self._epoch_inv(epoch)
                at, counts = self._within(col)
                row[at] += counts * integral * inv[at]
            out.append((b, *take_row(row)))
        self._spread = out
        self._records, self._runs = [], []
        self._pinned, self._pinned_links = {}, 0

    def _epoch_inv(self, epoch: int) -> Floats:
        if epoch == len(self._caps) - 1:
            return self._inv
        cap = self._caps[epoch]
        inv = np.zeros(cap.size)
        np.divide(1.0, cap, out=inv, where=cap > 0)
        return inv

    # -- reading ----------------------------------------------------------------------------

    @property
    def elapsed_s(self) -> float:
        return self.end_s - self.start_s

    def mean(self) -> Floats:
        """Time-weighted mean utilisation of each link (after :meth:`settle`)."""
        elapsed = self.elapsed_s
        out: Floats = self.busy_s / elapsed if elapsed > 0 else np.zeros(self.n_links)
        return out

    def series(self, links: Ints) -> tuple[Floats, Floats]:
        """Bin edges, and the mean utilisation of each of ``links`` per bin (links x bins)."""
        if not self._bin_s:
            return np.asarray([self.start_s, self.end_s]), np.zeros((links.size, 1))
        while self.elapsed_s > self._bin_s * self.max_bins:
            self._double()
        self._settle(self.end_s)
        w = self._bin_s
        n_bins = max(1, min(self.max_bins, math.ceil(self.elapsed_s / w - 1e-9)))
        edges: Floats = self.start_s + np.arange(n_bins + 1, dtype=np.float64) * w
        out = np.zeros((links.size, n_bins))
        row = np.full(self.n_links, -1, dtype=np.int64)
        row[links] = np.arange(links.size)
        pieces = self._bins()
        current = pieces.setdefault(self._cur, [])
        epoch_now = len(self._caps) - 1
        current.extend((epoch_now, item.col, item.value) for item in self._acc.values())
        for b, parts in pieces.items():
            if b >= n_bins:
                continue
            for epoch, col, integral in parts:
                those, counts = self._within(col)
                rows = row[those]
                mine = rows >= 0
                if mine.any():
                    inv = self._epoch_inv(epoch)[those[mine]]
                    out[rows[mine], b] += counts[mine] * integral * inv
        for b, those, vals in self._spread:
            rows = row[those]
            mine = rows >= 0
            if b < n_bins:
                out[rows[mine], b] += vals[mine]
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
