"""Sorted runs of a :class:`~.links.LinkTable`'s packed ``u << 32 | v`` keys, each with the
index of every key's link: merged into one, and searched."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["Run", "merge_runs", "search_runs"]

Run = tuple[NDArray[np.int64], NDArray[np.int32]]
"""Keys in increasing order, and the link index of each."""


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
