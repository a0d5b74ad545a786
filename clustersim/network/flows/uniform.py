"""Counts that are one value on every link but the last few, held as views of one array.

A folded step on a switched fabric crosses 10^5 to 10^6 links, and on a symmetric
fabric every one carries the same number of the step's flows; only the rows of
shared HBM at the end (:mod:`.hbm`) differ. Such a group's ``counts`` are then
the tail of one read-only array per ``(value, rows at the end)``, made as long as
the longest group that needs it: the groups of a run hold one copy of their
counts, not one each, and read the same values.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["MAX_TAIL", "UniformCounts"]

Floats = NDArray[np.float64]

MAX_TAIL = 64
"""Rows at the end (HBM rows) that may differ from the value on the links."""
_MIN_SIZE = 4096
"""Counts shorter than this are kept as they are (a view saves nothing there)."""


class UniformCounts:
    """The shared arrays, by ``(value, tail)`` (an owner keeps one, e.g. a network)."""

    def __init__(self) -> None:
        self._arrays: dict[tuple[float, bytes], Floats] = {}

    def share(self, counts: Floats, tail: int) -> Floats:
        """``counts`` (its last ``tail`` entries on HBM rows), or an equal read-only view of a
        shared array when every other entry is one value."""
        n = counts.size
        if n < _MIN_SIZE or not 0 <= tail <= MAX_TAIL or tail >= n:
            return counts
        head = counts[: n - tail]
        value = float(head[0])
        if not (head == value).all():
            return counts
        end = np.ascontiguousarray(counts[n - tail :], dtype=np.float64)
        key = (value, end.tobytes())
        found = self._arrays.get(key)
        if found is None or found.size < n:
            # Twice the size: a run of growing groups makes a few arrays, not one each.
            size = n if found is None else max(n, 2 * found.size)
            found = np.full(size, value)
            found[size - tail :] = end
            found.flags.writeable = False
            self._arrays[key] = found
        view: Floats = found[found.size - n :]
        return view
