"""Each chip's HBM as a capacity of the max-min solve (``FlowNetwork.share_hbm``).

The flow model's capacities are the topology's links, then one per chip: its
sustained HBM bandwidth, at index ``base + chip``. A flow between two chips reads
the source's HBM and writes the destination's, so a step's entity crosses the HBM
of every chip its flows start or end on, once per flow; a compute run is an entity
on its own chip's HBM with a ceiling at its demand. ``flows`` counts the flow
entities (not compute) moving through each chip's HBM.

**Slack HBM.** A chip's HBM row can bind only when its users could together ask
for more than it has. ``load_ub`` bounds what they can ask: each flow entity's
flows on the chip times the rate its other links (and its ceiling) allow it
alone, each fluid compute run's ceiling, and the full-speed demand of each
compute run on its fast path. While that bound fits the capacity the row never
saturates, so leaving it out of the solve changes no rate: the flows are solved
without it and compute stays one timeout. A chip whose bound passes its capacity
is *hot* (only while a flow is on it: a chip's ranks at full speed never
oversubscribe it): from then on, until its last flow leaves, every flow on it
carries its row and every compute run on it is a fluid user of it. ``strict`` makes a chip hot
as soon as any flow is on it (after a change of link capacities, which the
bounds do not follow).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from clustersim.network.flows.entity import FlowGroup

__all__ = ["SLACK_RTOL", "SharedHbm"]

SLACK_RTOL = 1e-9
"""A chip is hot once its users' bound is within this fraction of its capacity."""

_FEW_CHIPS = 8
"""Chips in ``only`` up to which :meth:`SharedHbm.add` counts each by comparison."""


class SharedHbm:
    """The HBM capacities after the topology's ``base`` links, one per chip.

    The per-chip counts are Python lists: an entity touches one or a few chips, and
    an element of a list costs a fraction of a numpy scalar's read and write.
    """

    def __init__(self, base: int, hbm_Bps: float | NDArray[np.float64], n_chips: int) -> None:
        self.base = base
        self.capacity: NDArray[np.float64] = np.broadcast_to(
            np.asarray(hbm_Bps, dtype=np.float64), (n_chips,)
        ).copy()
        self.flows: list[int] = [0] * n_chips
        """Flow entities moving through each chip's HBM now."""
        self.load_ub: list[float] = [0.0] * n_chips
        """An upper bound of the load each chip's entities can put on its HBM now."""
        self.users: list[int] = [0] * n_chips
        """Entities counted in ``load_ub``."""
        self.fast: list[float] = [0.0] * n_chips
        """The full-speed HBM demand of each chip's compute runs on their fast path, on
        chips with flows (kept by :class:`~clustersim.sim.hbm.ComputeRuns`)."""
        self.hot_of: list[bool] = [False] * n_chips
        """Chips whose HBM row is in the solve (see the module's note on slack)."""
        self.hot: NDArray[np.bool_] = np.zeros(n_chips, dtype=bool)
        """The same flags as an array, for entities on many chips."""
        limit = self.capacity * (1.0 - SLACK_RTOL)
        # One float object for every chip where they are alike (a million chips: 24 MB less).
        same = limit.size and (limit == limit[0]).all()
        self.limit: list[float] = [float(limit[0])] * limit.size if same else limit.tolist()
        self.strict = False
        """Every chip a flow is on is hot (set after link capacities change)."""
        self.first_flow: Callable[[int], None] | None = None
        """Called with a chip a flow arrives on that had none, before ``fast`` is read
        there: the compute runs keep ``fast`` only on chips with flows."""
        self.last_flow: Callable[[int], None] | None = None
        """Called with a chip whose last flow has left (hot or not)."""

    def compute_group(self, chip: int, demand_Bps: float) -> FlowGroup:
        """A compute run on ``chip``'s HBM, moving at most ``demand_Bps``."""
        link = np.asarray([self.base + chip], dtype=np.int64)
        return FlowGroup(link, np.ones(1), 1, 0.0, (), float(demand_Bps))

    def chips_of(self, links: NDArray[np.int64]) -> NDArray[np.int64]:
        """The chips whose HBM is among ``links``."""
        chips: NDArray[np.int64] = links[links >= self.base] - self.base
        return chips

    def heat(self, chips: list[int]) -> None:
        """``chips`` turn hot."""
        hot_of = self.hot_of
        for chip in chips:
            hot_of[chip] = True
        self.hot[chips] = True

    def with_flows(self) -> list[int]:
        """The chips with flows on them now."""
        return [chip for chip, n in enumerate(self.flows) if n]

    def enter(self, chips: list[int], load_Bps: list[float], flow: bool) -> list[int]:
        """An entity that can load ``chips``' HBM by up to ``load_Bps`` arrives (a flow's,
        or a compute run's): the chips that turn hot (not hot yet, with flows, and
        their bound now passes their capacity)."""
        flows, load_ub, users, hot_of = self.flows, self.load_ub, self.users, self.hot_of
        fast, limit, strict, first = self.fast, self.limit, self.strict, self.first_flow
        turned: list[int] = []
        for chip, load in zip(chips, load_Bps, strict=True):
            if flow:
                n = flows[chip] = flows[chip] + 1
                if n == 1 and first is not None:
                    first(chip)
            load_ub[chip] += load
            users[chip] += 1
            # Without flows the row cannot bind: a chip's ranks at full speed fit its HBM.
            if (
                flows[chip]
                and not hot_of[chip]
                and (strict or load_ub[chip] + fast[chip] > limit[chip])
            ):
                turned.append(chip)
        return turned

    def over(self, chip: int) -> bool:
        """Whether ``chip`` (with flows on it) must turn hot now."""
        return self.strict or self.load_ub[chip] + self.fast[chip] > self.limit[chip]

    def leave(self, chips: list[int], load_Bps: list[float], flow: bool) -> list[int]:
        """An entity counted by :meth:`enter` is gone; a chip left without flows cools.
        Returns the chips that cooled (were hot)."""
        flows, load_ub, users, hot_of = self.flows, self.load_ub, self.users, self.hot_of
        last = self.last_flow
        cooled: list[int] = []
        for chip, load in zip(chips, load_Bps, strict=True):
            if flow:
                n_flows = flows[chip] = flows[chip] - 1
                if not n_flows and last is not None:
                    last(chip)
            n = users[chip] = users[chip] - 1
            if n:
                load_ub[chip] -= load
            else:
                load_ub[chip] = 0.0  # no rounding residue left behind
            if not flows[chip] and hot_of[chip]:
                hot_of[chip] = False
                cooled.append(chip)
        if cooled:
            self.hot[cooled] = False
        return cooled

    def add(
        self,
        links: NDArray[np.int64],
        counts: NDArray[np.float64],
        src: NDArray[np.int64],
        dst: NDArray[np.int64],
        only: NDArray[np.int64] | None = None,
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """``links`` (sorted) and ``counts`` with the HBM reads at ``src`` and the writes at
        ``dst`` chips, on the chips in ``only`` (distinct, increasing; default every chip).
        Flows within one chip cross no link and are left out."""
        if only is not None and only.size <= _FEW_CHIPS:
            # A few chips (a folded step's first chips): counts by comparison, not a gather.
            n_at = []
            for chip in only.tolist():
                out, into = src == chip, dst == chip
                both = np.count_nonzero(out & into)
                n_at.append(np.count_nonzero(out) + np.count_nonzero(into) - 2 * both)
            per = np.asarray(n_at, dtype=np.float64)
            return (
                np.concatenate([links, self.base + only[per > 0].astype(np.int64)]),
                np.concatenate([counts, per[per > 0]]),
            )
        apart = src != dst
        ends = np.concatenate([src[apart], dst[apart]])
        if only is not None:
            keep = np.zeros(self.capacity.size, dtype=bool)
            keep[only] = True
            ends = ends[keep[ends]]
        chips, n = np.unique(ends, return_counts=True)
        return (
            np.concatenate([links, self.base + chips.astype(np.int64)]),
            np.concatenate([counts, n.astype(np.float64)]),
        )
