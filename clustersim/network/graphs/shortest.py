"""Shortest distances and reachability on a fabric graph's links, without scipy where it is small.

scipy's csgraph takes a third of a second or more to import (it brings scipy.sparse,
scipy.linalg and parts of numpy along), more than a few searches over a graph of a
few thousand links cost in plain Python. :class:`Distances` runs its first
:data:`PY_RUNS` searches on a graph of at most :data:`PY_MAX_LINKS` links with a
binary heap, and only then (or on a larger graph) imports scipy's Dijkstra. Both
give the same distances to the last bit: with positive weights, each node's
distance is the least ``distance[next] + weight`` over its links, the one fixed
point both searches reach, each sum rounded once, as both round it.

:func:`strongly_connected_to` is the same for the question the graph checks ask once:
which nodes reach a given node and are reached from it.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    import scipy.sparse as sp

__all__ = ["PY_MAX_LINKS", "PY_RUNS", "Distances", "strongly_connected_to"]

PY_MAX_LINKS = 50_000
"""Largest graph (in links) searched in plain Python."""
PY_RUNS = 8
"""Searches in plain Python on one graph before scipy takes over."""

Int64s = NDArray[np.int64]


def _adjacency(n: int, a: Int64s, b: Int64s) -> tuple[list[int], list[int], Int64s]:
    """The links ``a -> b`` grouped by ``a``: ``b[order[ptr[x] : ptr[x + 1]]]`` leave ``x``."""
    order = np.argsort(a, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(a, minlength=n), out=ptr[1:])
    return ptr.tolist(), b[order].tolist(), order


class Distances:
    """Distances to any node over the links ``u -> v`` of ``weight`` (positive)."""

    def __init__(self, n: int, u: Int64s, v: Int64s, weight: NDArray[np.float64]) -> None:
        self.n = n
        self.u, self.v, self.weight = u, v, weight
        self.python_runs = PY_RUNS if u.size <= PY_MAX_LINKS else 0
        """Searches left to run in plain Python."""
        self._into: tuple[list[int], list[int], list[float]] | None = None
        self._reverse: sp.csr_matrix | None = None

    def to(self, dst: int) -> NDArray[np.float64]:
        """Each node's distance to ``dst`` (``inf`` where it cannot reach it)."""
        if self.python_runs > 0:
            self.python_runs -= 1
            return self._heap(dst)
        from scipy.sparse.csgraph import dijkstra

        if self._reverse is None:
            import scipy.sparse as sp

            self._reverse = sp.csr_matrix((self.weight, (self.v, self.u)), shape=(self.n, self.n))
        out: NDArray[np.float64] = dijkstra(
            self._reverse, directed=True, indices=np.asarray([dst])
        )[0]
        return out

    def _heap(self, dst: int) -> NDArray[np.float64]:
        if self._into is None:
            ptr, src, order = _adjacency(self.n, self.v, self.u)
            self._into = ptr, src, self.weight[order].tolist()
        ptr, src, weight = self._into
        dist = [math.inf] * self.n
        dist[dst] = 0.0
        done = [False] * self.n
        heap = [(0.0, dst)]
        while heap:
            d, x = heapq.heappop(heap)
            if done[x]:
                continue
            done[x] = True
            for k in range(ptr[x], ptr[x + 1]):
                y = src[k]
                nd = d + weight[k]
                if nd < dist[y]:
                    dist[y] = nd
                    heapq.heappush(heap, (nd, y))
        return np.asarray(dist, dtype=np.float64)


def _reached(n: int, a: Int64s, b: Int64s, start: int) -> NDArray[np.bool_]:
    ptr, nxt, _ = _adjacency(n, a, b)
    seen = [False] * n
    seen[start] = True
    stack = [start]
    while stack:
        x = stack.pop()
        for k in range(ptr[x], ptr[x + 1]):
            y = nxt[k]
            if not seen[y]:
                seen[y] = True
                stack.append(y)
    return np.asarray(seen, dtype=bool)


def strongly_connected_to(n: int, u: Int64s, v: Int64s, start: int) -> NDArray[np.bool_]:
    """Which of ``n`` nodes lie in ``start``'s strongly connected component over the
    links ``u -> v``: reached from it and reaching it."""
    if u.size <= PY_MAX_LINKS:
        return _reached(n, u, v, start) & _reached(n, v, u, start)
    import scipy.sparse as sp
    from scipy.sparse.csgraph import connected_components

    graph: Any = sp.csr_matrix((np.ones(u.size), (u, v)), shape=(n, n))
    _, comp = connected_components(graph, directed=True, connection="strong")
    same: NDArray[np.bool_] = comp == comp[start]
    return same
