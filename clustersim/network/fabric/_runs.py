"""Sorted runs of a :class:`~.links.LinkTable`'s packed ``u << 32 | v`` keys, each with the
index of every key's link: merged into one, and searched."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

__all__ = ["FEW_LINKS", "Run", "merge_runs", "repeats", "search_runs", "search_tail"]

Run = tuple[NDArray[np.int64], NDArray[np.int32]]
"""Keys in increasing order, and the link index of each."""
FEW_LINKS = 64
"""Keys a lookup may ask for and have the sorted runs searched one by one, not merged."""


def merge_runs(runs: list[Run]) -> Run:
    """``runs`` merged into one (keys are distinct: one sorted order; the stable sort merges
    the sorted runs it finds). The list is emptied: hold no other reference to its runs,
    so each array is let go as soon as it is joined (at a million chips, 100 MiB each)."""
    key_parts = [run[0] for run in runs]
    order_parts = [run[1] for run in runs]
    runs.clear()
    keys = np.concatenate(key_parts)
    del key_parts
    at = np.argsort(keys, kind="stable")
    keys = keys[at]
    order = np.concatenate(order_parts)
    del order_parts
    return keys, order[at]


def search_runs(runs: list[Run], keys: NDArray[np.int64]) -> NDArray[np.int64]:
    """The link index of each of ``keys`` found in ``runs``, or -1."""
    out = np.full(keys.shape, -1, dtype=np.int64)
    for sorted_keys, order in runs:
        if sorted_keys.size:
            pos = np.minimum(np.searchsorted(sorted_keys, keys), sorted_keys.size - 1)
            hit = (sorted_keys[pos] == keys) & (out < 0)
            out[hit] = order[pos[hit]]
    return out


def search_tail(
    keys: NDArray[np.int64], out: NDArray[np.int64], tail: NDArray[np.int64], start: int
) -> NDArray[np.int64]:
    """``out`` with the keys it misses (-1) looked up among the unsorted ``tail`` of keys,
    whose first is link ``start``'s."""
    if tail.size:
        miss = np.flatnonzero(out < 0)
        if miss.size:
            eq = keys[miss, None] == tail[None, :]
            found = eq.any(axis=1)
            out[miss[found]] = start + np.argmax(eq[found], axis=1)
    return out


def repeats(
    ordered: NDArray[np.int64],
    order: NDArray[np.intp],
    seen: NDArray[np.bool_],
    find: Callable[[NDArray[np.int64]], NDArray[np.int64]],
) -> NDArray[np.bool_]:
    """Whether each new key (``ordered``: the keys sorted by ``order``) repeats one before it
    or one that ``find`` finds (-1: none), searched for only where ``seen`` (the keys in
    their own order) is set."""
    dup = np.zeros(order.size, dtype=bool)
    dup[order[1:][ordered[1:] == ordered[:-1]]] = True
    seen = seen[order]
    if seen.all():
        dup[order] |= find(ordered) >= 0
    elif seen.any():
        dup[order[seen]] |= find(ordered[seen]) >= 0
    return dup
