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

import numpy as np
from numpy.typing import NDArray

from clustersim.network.entity import FlowGroup

__all__ = ["SLACK_RTOL", "SharedHbm"]

SLACK_RTOL = 1e-9
"""A chip is hot once its users' bound is within this fraction of its capacity."""

SMALL = 4
"""Entities on at most this many chips' HBM are counted one chip at a time (cheaper
than numpy's fancy indexing on a few elements: a folded step's entity has one)."""


class SharedHbm:
    """The HBM capacities after the topology's ``base`` links, one per chip."""

    def __init__(self, base: int, hbm_Bps: float | NDArray[np.float64], n_chips: int) -> None:
        self.base = base
        self.capacity: NDArray[np.float64] = np.broadcast_to(
            np.asarray(hbm_Bps, dtype=np.float64), (n_chips,)
        ).copy()
        self.flows: NDArray[np.int64] = np.zeros(n_chips, dtype=np.int64)
        """Flow entities moving through each chip's HBM now."""
        self.load_ub: NDArray[np.float64] = np.zeros(n_chips)
        """An upper bound of the load each chip's entities can put on its HBM now."""
        self.users: NDArray[np.int64] = np.zeros(n_chips, dtype=np.int64)
        """Entities counted in ``load_ub``."""
        self.fast: NDArray[np.float64] = np.zeros(n_chips)
        """The full-speed HBM demand of each chip's compute runs on their fast path
        (kept by :class:`~clustersim.sim.hbm.ComputeRuns`, one element at a time)."""
        self.hot: NDArray[np.bool_] = np.zeros(n_chips, dtype=bool)
        """Chips whose HBM row is in the solve (see the module's note on slack)."""
        self.limit: NDArray[np.float64] = self.capacity * (1.0 - SLACK_RTOL)
        self.strict = False
        """Every chip a flow is on is hot (set after link capacities change)."""

    def compute_group(self, chip: int, demand_Bps: float) -> FlowGroup:
        """A compute run on ``chip``'s HBM, moving at most ``demand_Bps``."""
        link = np.asarray([self.base + chip], dtype=np.int64)
        return FlowGroup(link, np.ones(1), 1, 0.0, (), float(demand_Bps))

    def chips_of(self, links: NDArray[np.int64]) -> NDArray[np.int64]:
        """The chips whose HBM is among ``links``."""
        chips: NDArray[np.int64] = links[links >= self.base] - self.base
        return chips

    def enter(
        self, chips: NDArray[np.int64], load_Bps: NDArray[np.float64], flow: bool
    ) -> list[int]:
        """An entity that can load ``chips``' HBM by up to ``load_Bps`` arrives (a flow's,
        or a compute run's): the chips that turn hot (not hot yet, with flows, and
        their bound now passes their capacity)."""
        if chips.size > SMALL:
            return self._enter_many(chips, load_Bps, flow)
        flows, load_ub, users, hot = self.flows, self.load_ub, self.users, self.hot
        turned: list[int] = []
        for chip, load in zip(chips.tolist(), load_Bps.tolist(), strict=True):
            if flow:
                flows[chip] += 1
            load_ub[chip] += load
            users[chip] += 1
            # Without flows the row cannot bind: a chip's ranks at full speed fit its HBM.
            if flows[chip] and not hot[chip] and self.over(chip):
                turned.append(chip)
        return turned

    def _enter_many(
        self, chips: NDArray[np.int64], load_Bps: NDArray[np.float64], flow: bool
    ) -> list[int]:
        if flow:
            self.flows[chips] += 1
        self.load_ub[chips] += load_Bps
        self.users[chips] += 1
        over = self.flows[chips] > 0
        if not self.strict:
            over &= self.load_ub[chips] + self.fast[chips] > self.limit[chips]
        turned: list[int] = chips[over & ~self.hot[chips]].tolist()
        return turned

    def over(self, chip: int) -> bool:
        """Whether ``chip`` (with flows on it) must turn hot now."""
        return bool(self.strict or self.load_ub[chip] + self.fast[chip] > self.limit[chip])

    def leave(
        self, chips: NDArray[np.int64], load_Bps: NDArray[np.float64], flow: bool
    ) -> list[int]:
        """An entity counted by :meth:`enter` is gone; a chip left without flows cools.
        Returns the chips that cooled (were hot)."""
        if chips.size > SMALL:
            return self._leave_many(chips, load_Bps, flow)
        flows, load_ub, users, hot = self.flows, self.load_ub, self.users, self.hot
        cooled: list[int] = []
        for chip, load in zip(chips.tolist(), load_Bps.tolist(), strict=True):
            if flow:
                flows[chip] -= 1
            users[chip] -= 1
            if users[chip]:
                load_ub[chip] -= load
            else:
                load_ub[chip] = 0.0  # no rounding residue left behind
            if not flows[chip] and hot[chip]:
                hot[chip] = False
                cooled.append(chip)
        return cooled

    def _leave_many(
        self, chips: NDArray[np.int64], load_Bps: NDArray[np.float64], flow: bool
    ) -> list[int]:
        if flow:
            self.flows[chips] -= 1
        self.load_ub[chips] -= load_Bps
        self.users[chips] -= 1
        idle = chips[self.users[chips] == 0]
        if idle.size:
            self.load_ub[idle] = 0.0
        cool = chips[(self.flows[chips] == 0) & self.hot[chips]]
        if cool.size:
            self.hot[cool] = False
        cooled: list[int] = cool.tolist()
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
        ``dst`` chips, on the chips in ``only`` (default every chip). Flows within
        one chip cross no link and are left out."""
        apart = src != dst
        ends = np.concatenate([src[apart], dst[apart]])
        if only is not None:
            keep = np.zeros(self.flows.size, dtype=bool)
            keep[only] = True
            ends = ends[keep[ends]]
        chips, n = np.unique(ends, return_counts=True)
        return (
            np.concatenate([links, self.base + chips.astype(np.int64)]),
            np.concatenate([counts, n.astype(np.float64)]),
        )
