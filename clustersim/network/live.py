"""Which groups are on the links now, and the component of each (:mod:`.flows`).

Entities that share a link belong to one component. Finding the components a
joining entity touches by marking its links costs work per link at every join
and departure, and a folded step at 10^6 chips crosses 10^5 links or more. But
the entities in flight are routed as a few hundred distinct groups: whether two
groups share a link is decided once per pair (one pass over their links) and
remembered, and every join then looks only at the groups in flight. Two
entities of one group share every link of it, so they are always in the same
component: the component is kept per group.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from clustersim.network.entity import Component, FlowGroup

__all__ = ["LiveGroups"]


class _Slot:
    __slots__ = ("comp", "count")

    def __init__(self, comp: Component) -> None:
        self.count = 1
        self.comp = comp


class LiveGroups:
    """The groups with entities in components now: how many of each, and their
    component; and, per pair of groups, whether they share a link (cached)."""

    max_pairs: int = 1 << 18
    """The pair cache is cleared when it holds this many pairs (it keeps the groups alive)."""

    def __init__(self, size: int) -> None:
        self._live: dict[FlowGroup, _Slot] = {}
        """Each group with entities in components: how many, and their component."""
        self._shares: dict[FlowGroup, dict[FlowGroup, bool]] = {}
        self._pairs = 0
        self._mark: NDArray[np.int64] = np.zeros(size, dtype=np.int64)
        self._stamp = 0

    def resize(self, size: int) -> None:
        """Link indices now run up to ``size - 1``."""
        if size > self._mark.size:
            self._mark = np.concatenate([self._mark, np.zeros(size - self._mark.size, np.int64)])

    def add(self, group: FlowGroup, comp: Component) -> None:
        """One more entity of ``group`` in ``comp`` (that of the group's others, if any)."""
        if not group.links.size:
            return  # on no link: it shares nothing, and needs no entry
        slot = self._live.get(group)
        if slot is None:
            self._live[group] = _Slot(comp)
        else:
            slot.count += 1
            slot.comp = comp

    def remove(self, group: FlowGroup) -> None:
        """One entity of ``group`` left its component."""
        slot = self._live.get(group)
        if slot is None:
            return
        slot.count -= 1
        if not slot.count:
            del self._live[group]

    def move(self, group: FlowGroup, comp: Component) -> None:
        """The entities of ``group`` are now in ``comp`` (components merged)."""
        slot = self._live.get(group)
        if slot is not None:
            slot.comp = comp

    def touched(self, group: FlowGroup) -> list[Component]:
        """The components of the groups in flight that share a link with ``group``, in
        order of their ids (the order in which marking their links would find them)."""
        live = self._live
        if not live or not group.links.size:
            return []
        if self._pairs > self.max_pairs:
            self._shares.clear()
            self._pairs = 0
        shares = self._shares.get(group)
        if shares is None:
            shares = self._shares[group] = {}
        unknown = [other for other in live if other not in shares]
        if unknown:
            self._learn(group, shares, unknown)
        found: dict[int, Component] = {}
        for other, slot in live.items():
            if shares[other]:
                found[slot.comp.ident] = slot.comp
        if len(found) < 2:
            return list(found.values())
        return [found[i] for i in sorted(found)]

    def _learn(
        self, group: FlowGroup, shares: dict[FlowGroup, bool], others: list[FlowGroup]
    ) -> None:
        """Whether ``group`` shares a link with each of ``others``: its links are marked
        once, and each other group's looked up."""
        self._stamp += 1
        stamp = self._stamp
        mark = self._mark
        mark[group.links] = stamp
        for other in others:
            hit = other is group or bool((mark[other.links] == stamp).any())
            shares[other] = hit
            back = self._shares.get(other)
            if back is not None:
                back[group] = hit
        self._pairs += len(others)
