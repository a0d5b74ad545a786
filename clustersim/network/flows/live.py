"""Which groups are on the links now, and the component of each (:mod:`.flownetwork`).

Entities that share a link belong to one component. Finding the components a
joining entity touches by marking its links costs work per link at every join
and departure, and a folded step at 10^6 chips crosses 10^5 links or more. But
the entities in flight are routed as a few hundred distinct groups: whether two
groups share a link is decided once per pair (one pass over their links) and
remembered (the links they share, which the solve of their component reads:
:mod:`.classes`), and every join then looks only at the groups in flight. Two
entities of one group share every link of it, so they are always in the same
component: the component is kept per group.

A group's links are also held as the blocks of :data:`BLOCK` consecutive link ids they
fall in (a few hundred for a step's 10^5 links, which lie in few ranges of ids). Two
groups with no block in common share no link, so only the pairs that meet on a
block are looked up link by link: the groups of other pipeline stages, say, are on
other chips' links.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from clustersim.network.flows.entity import Component, FlowGroup, LinkIds

__all__ = ["BLOCK", "LiveGroups", "Shared"]

BLOCK_SHIFT = 10
BLOCK = 1 << BLOCK_SHIFT
_MAX_STAMP = int(np.iinfo(np.uint8).max)
"""The last stamp before the marks are cleared and start over."""
"""Consecutive link ids per block of the pre-filter (see the module's note)."""
_WHOLE_UP_TO = 1 << 14
"""Links of a group and those it may meet up to which all of them are compared, not only
those in the blocks they meet on."""


class Shared:
    """The links two groups both cross (sorted), and where each group has them."""

    __slots__ = ("_at", "links")

    def __init__(self, links: LinkIds) -> None:
        self.links = links
        self._at: dict[int, NDArray[np.int64]] = {}

    def at(self, group: FlowGroup) -> NDArray[np.int64]:
        """The positions of :attr:`links` in ``group.links`` (one of the two groups)."""
        found = self._at.get(id(group))
        if found is None:
            found = np.searchsorted(group.links, self.links).astype(np.int64)
            self._at[id(group)] = found  # the pair's entry holds both groups alive
        return found


_NOTHING = Shared(np.zeros(0, dtype=np.int64))


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

    max_shared_links: int = 1 << 24
    """... or when the links the pairs share pass this many entries."""

    def __init__(self, size: int, slots: Callable[[int], NDArray[np.int32]] | None = None) -> None:
        self._live: dict[FlowGroup, _Slot] = {}
        """Each group with entities in components: how many, and their component."""
        self._shares: dict[FlowGroup, dict[FlowGroup, Shared]] = {}
        self._pairs = 0
        self._shared_links = 0
        # A stamp counts the groups learnt (8 bits a link, starting over at 255); a
        # position is within a group (32 bits).
        self._mark: NDArray[np.uint8] = np.zeros(size, dtype=np.uint8)
        self._slots = slots
        """A scratch position per link shared with others (``slots(size)``), if given."""
        self._pos: NDArray[np.int32] = np.zeros(0 if slots else size, dtype=np.int32)
        """Each link's position in the links of the group marked last (without ``slots``)."""
        self._block_mark: NDArray[np.int64] = np.zeros((size >> BLOCK_SHIFT) + 1, np.int64)
        self._blocks: dict[FlowGroup, NDArray[np.int64]] = {}
        """The blocks of each group's links (distinct, increasing)."""
        self._stamp = 0

    def resize(self, size: int) -> None:
        """Link indices now run up to ``size - 1``."""
        if size > self._mark.size:
            self._mark = np.concatenate([self._mark, np.zeros(size - self._mark.size, np.uint8)])
            if self._slots is None:
                self._pos = np.zeros(size, dtype=np.int32)
            grown = (size >> BLOCK_SHIFT) + 1 - self._block_mark.size
            if grown > 0:
                self._block_mark = np.concatenate([self._block_mark, np.zeros(grown, np.int64)])

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
        self._bound()
        shares = self._shares.get(group)
        if shares is None:
            shares = self._shares[group] = {}
        unknown = [other for other in live if other not in shares]
        if unknown:
            self._learn(group, shares, unknown)
        found: dict[int, Component] = {}
        for other, slot in live.items():
            if shares[other].links.size:
                found[slot.comp.ident] = slot.comp
        if len(found) < 2:
            return list(found.values())
        return [found[i] for i in sorted(found)]

    def common(self, a: FlowGroup, b: FlowGroup) -> Shared:
        """The links that groups ``a`` and ``b`` both cross (remembered)."""
        found = self._shares.get(a, {}).get(b)
        if found is not None:
            return found
        self._bound()
        shares = self._shares.get(a)
        if shares is None:
            shares = self._shares[a] = {}
        self._learn(a, shares, [b])
        return shares[b]

    def _bound(self) -> None:
        if self._pairs > self.max_pairs or self._shared_links > self.max_shared_links:
            self._shares.clear()
            self._blocks.clear()
            self._pairs = self._shared_links = 0

    def _blocks_of(self, group: FlowGroup) -> NDArray[np.int64]:
        found = self._blocks.get(group)
        if found is None:
            # links are sorted, so their blocks are too: the first of each run is kept.
            blocks = group.links >> BLOCK_SHIFT
            keep = np.ones(blocks.size, dtype=bool)
            keep[1:] = blocks[1:] != blocks[:-1]
            found = self._blocks[group] = blocks[keep]
            self._pairs += 1  # held until the pair cache is cleared
        return found

    def _learn(
        self,
        group: FlowGroup,
        shares: dict[FlowGroup, Shared],
        others: list[FlowGroup],
    ) -> None:
        """The links ``group`` shares with each of ``others``: its blocks are marked once,
        all the other groups' blocks looked up at once, then, for those that meet it on a
        block, its links and theirs in the blocks they meet on (most share none; only those
        that do cost a search of their own)."""
        self._stamp += 1
        if self._stamp > _MAX_STAMP:  # the marks start over: 8 bits a link
            self._mark[:] = 0
            self._block_mark[:] = 0
            self._stamp = 1
        stamp = self._stamp
        blocks = self._blocks_of(group)
        self._block_mark[blocks] = stamp
        near = _meets(self._block_mark, stamp, [self._blocks_of(other) for other in others])
        maybe = [other for other, meets in zip(others, near, strict=True) if meets]
        for other, meets in zip(others, near, strict=True):
            if not meets:
                self._share(group, shares, other, _NOTHING)
        if not maybe:
            return
        # The group shares all of its links with itself: only the others are looked up,
        # and only at their links in the blocks the group has (the rest cannot meet it).
        rest = [other for other in maybe if other is not group]
        if group.links.size + sum(other.links.size for other in rest) <= _WHOLE_UP_TO:
            spans = [np.arange(other.links.size) for other in rest]  # few: every link
            at_group = np.arange(group.links.size)
        else:
            block_mark = self._block_mark
            mine = [b[block_mark[b] == stamp] for b in (self._blocks_of(other) for other in rest)]
            spans = [_positions(other.links, b) for other, b in zip(rest, mine, strict=True)]
            at_group = _positions(
                group.links, np.unique(np.concatenate(mine)) if mine else blocks[:0]
            )
        mark = self._mark
        near_links = group.links[at_group]  # the group's links in the blocks they meet on
        mark[near_links] = stamp
        sizes = [at.size for at in spans]
        ends = np.cumsum(sizes) if rest else np.zeros(0, dtype=np.int64)
        flat = (
            mark[np.concatenate([other.links[at] for other, at in zip(rest, spans, strict=True)])]
            == stamp
            if rest
            else mark[:0]
        )
        before = np.zeros(flat.size + 1, dtype=np.int64)
        np.cumsum(flat, out=before[1:])
        counts = (before[ends] - before[ends - sizes]).tolist() if rest else []
        pos: NDArray[np.int32] | None = None  # the group's positions, made when first needed
        found = iter(zip((ends - sizes).tolist(), spans, counts, strict=True))
        for other in maybe:
            if other is group:
                self._share(group, shares, other, Shared(group.links))
                continue
            start, at, count = next(found)
            both = _NOTHING
            if count:
                if pos is None:
                    pos = self._pos if self._slots is None else self._slots(mark.size)
                    pos[near_links] = at_group.astype(np.int32)
                hit = at[np.flatnonzero(flat[start : start + at.size])]
                both = Shared(other.links[hit])
                both._at[id(other)] = hit
                both._at[id(group)] = pos[both.links].astype(np.int64)  # where the group has them
            self._share(group, shares, other, both)

    def _share(
        self, group: FlowGroup, shares: dict[FlowGroup, Shared], other: FlowGroup, both: Shared
    ) -> None:
        shares[other] = both
        self._shared_links += 3 * both.links.size
        self._pairs += 1
        back = self._shares.get(other)
        if back is not None:
            back[group] = both


def _meets(mark: NDArray[np.int64], stamp: int, blocks: list[NDArray[np.int64]]) -> list[bool]:
    """Whether each array of ``blocks`` has a block marked with ``stamp``."""
    sizes = [b.size for b in blocks]
    flat = mark[np.concatenate(blocks)] == stamp
    ends = np.cumsum(sizes)
    before = np.concatenate([[0], np.cumsum(flat)])
    hits: list[bool] = (before[ends] - before[ends - sizes] > 0).tolist()
    return hits


def _positions(links: LinkIds, blocks: NDArray[np.int64]) -> NDArray[np.int64]:
    """The positions in ``links`` (sorted) of those in ``blocks`` (increasing): each block's
    links are one run of positions."""
    lo = np.searchsorted(links, blocks << BLOCK_SHIFT)
    hi = np.searchsorted(links, (blocks + 1) << BLOCK_SHIFT)
    lengths = hi - lo
    first = np.zeros(lengths.size, dtype=np.int64)
    np.cumsum(lengths[:-1], out=first[1:])
    total = int(lengths.sum())
    out: NDArray[np.int64] = np.repeat(lo - first, lengths) + np.arange(total, dtype=np.int64)
    return out
