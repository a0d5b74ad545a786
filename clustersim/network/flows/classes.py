"""Link classes: a component solved over the links its groups share, and a class per
kind of link that one group crosses alone (:mod:`.solve`).

Progressive filling (:mod:`.maxmin`) raises the rates of a component's entities
until links saturate. A link that only one of the component's groups crosses
(``counts`` of its flows, capacity ``cap``) saturates when that group's rate
reaches ``cap / counts``; whichever of the group's private links does, the group
freezes at the level of the lowest, and nothing else changes. So the private
links of a group are interchangeable with the one of lowest ``cap / counts``,
and the solve needs only the links that several groups cross, plus one row per
group for its tightest private link: the same rates, bit for bit (every
saturation level is computed from the same operands, and each shared link's
weight sums the same entries in the same order).

A folded step on a switched fabric crosses 10^5 to 10^6 links, mostly alike: the
same capacity and the same number of the group's flows. A group's links are
grouped by ``(capacity, count)`` into *classes* (a handful per group, found once
per group and capacity epoch): the tightest private link is then the tightest
class that still has a link outside the shared ones, found from the shared
links alone. Links of one class are never merged across groups: a link is
shared or private per component, and classes only stand for private links.
Groups with more classes than :data:`MAX_CLASSES` are searched link by link.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from clustersim.network.flows.entity import FlowGroup
from clustersim.network.flows.live import Shared

__all__ = ["MAX_CLASSES", "ClassCache", "Classes", "intersect", "private_row"]

Floats = NDArray[np.float64]
Ints = NDArray[np.int64]

MAX_CLASSES = 64
"""Classes of a group above which its private links are searched one by one."""

Common = Callable[[FlowGroup, FlowGroup], Shared]
"""The links that two groups both cross (:meth:`.live.LiveGroups.common`)."""


class Classes:
    """A group's links by ``(cap, count)``: class ``k`` holds ``size[k]`` links."""

    __slots__ = ("cap", "count", "size")

    def __init__(self, cap: Floats, count: Floats, size: Ints) -> None:
        self.cap = cap
        self.count = count
        self.size = size


def classes_of(cap: Floats, counts: Floats) -> Classes | None:
    """The distinct ``(cap[i], counts[i])`` pairs and how many links have each; None past
    :data:`MAX_CLASSES` (one pass over the links per class)."""
    caps: list[float] = []
    cnts: list[float] = []
    sizes: list[int] = []
    rest_cap, rest_cnt = cap, counts
    while rest_cap.size:
        if len(caps) == MAX_CLASSES:
            return None
        c0, n0 = rest_cap[0], rest_cnt[0]
        same = (rest_cap == c0) & (rest_cnt == n0)
        caps.append(float(c0))
        cnts.append(float(n0))
        k = int(np.count_nonzero(same))
        sizes.append(k)
        if k == rest_cap.size:
            break
        other = ~same
        rest_cap, rest_cnt = rest_cap[other], rest_cnt[other]
    return Classes(np.asarray(caps), np.asarray(cnts), np.asarray(sizes, dtype=np.int64))


class ClassCache:
    """Each group's :class:`Classes` under the capacities of now (:meth:`clear` when they
    change)."""

    max_groups: int = 1 << 16

    def __init__(self) -> None:
        self._known: dict[int, tuple[FlowGroup, Classes | None]] = {}

    def clear(self) -> None:
        self._known.clear()

    def of(self, group: FlowGroup, cap: Floats) -> Classes | None:
        found = self._known.get(id(group))
        if found is not None and found[0] is group:
            return found[1]
        if len(self._known) >= self.max_groups:
            self._known.clear()
        classes = classes_of(cap[group.links], group.counts)
        self._known[id(group)] = (group, classes)  # holds the group: its id is not reused
        return classes


def intersect(a: FlowGroup, b: FlowGroup) -> Shared:
    """The links both groups cross (without a cache)."""
    return Shared(np.intersect1d(a.links, b.links, assume_unique=True).astype(np.int64))


def tightest(cap: Floats, count: Floats, times: float | None) -> int:
    """The index of the lowest ``cap / (count x times)``: the saturation level progressive
    filling computes for a link crossed by one column (``count x times`` flows)."""
    weight = count if times is None else count * times
    return int(np.argmin(cap / weight))


def private_row(
    group: FlowGroup,
    classes: Classes | None,
    cap: Floats,
    at: Ints,
    times: float | None,
) -> tuple[float, float] | None:
    """``(capacity, count)`` of ``group``'s tightest link outside its shared ones (its
    links at positions ``at``), or None when every link it crosses is shared."""
    if classes is None:  # many classes: the links themselves
        mask = np.ones(group.links.size, dtype=bool)
        mask[at] = False
        if not mask.any():
            return None
        cap_p, count_p = cap[group.links[mask]], group.counts[mask]
        i = tightest(cap_p, count_p, times)
        return float(cap_p[i]), float(count_p[i])
    left = classes.size.copy()
    if at.size:
        # The classes split the group's links: the shared links of the last class are
        # those of no other (a group of one class needs no look at its shared links).
        others = 0
        if left.size > 1:
            cap_s, count_s = cap[group.links[at]], group.counts[at]
            for k in range(left.size - 1):
                n_k = int(
                    np.count_nonzero((cap_s == classes.cap[k]) & (count_s == classes.count[k]))
                )
                left[k] -= n_k
                others += n_k
        left[-1] -= at.size - others
    open_ = np.flatnonzero(left > 0)
    if not open_.size:
        return None
    i = open_[tightest(classes.cap[open_], classes.count[open_], times)]
    return float(classes.cap[i]), float(classes.count[i])
