"""The plain-Python searches on a fabric's links give what scipy's csgraph gives, to the bit."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components, dijkstra

from clustersim.network.graphs import shortest
from clustersim.network.graphs.shortest import Distances, strongly_connected_to


def random_links(seed: int, n: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``m`` distinct directed links without self-loops, with latencies of a few sizes (ties)
    plus the routing epsilon, as a fabric's routing graph weighs them."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, n, 3 * m)
    v = rng.integers(0, n, 3 * m)
    keep = u != v
    pairs = np.unique(np.stack([u[keep], v[keep]], 1), axis=0)[:m]
    latency = rng.choice([0.5e-6, 1e-6, 1.5e-6, 3.3e-6, 0.0], pairs.shape[0])
    return pairs[:, 0].copy(), pairs[:, 1].copy(), latency + 1e-12


@pytest.mark.parametrize("seed", range(6))
def test_heap_distances_equal_scipy(seed: int) -> None:
    n = 60
    u, v, w = random_links(seed, n, 240)
    reverse = sp.csr_matrix((w, (v, u)), shape=(n, n))
    heap = Distances(n, u, v, w)
    for dst in range(n):
        heap.python_runs = 1
        want = dijkstra(reverse, directed=True, indices=np.asarray([dst]))[0]
        np.testing.assert_array_equal(heap.to(dst), want)


def test_scipy_takes_over_after_the_first_searches() -> None:
    n = 30
    u, v, w = random_links(11, n, 120)
    dist = Distances(n, u, v, w)
    heap = [dist.to(d) for d in range(shortest.PY_RUNS)]
    assert dist.python_runs == 0
    again = Distances(n, u, v, w)
    again.python_runs = 0
    for d in range(shortest.PY_RUNS):
        np.testing.assert_array_equal(again.to(d), heap[d])
    assert dist._reverse is None
    dist.to(0)
    assert dist._reverse is not None


@pytest.mark.parametrize("seed", range(6))
def test_strong_component_equals_scipy(seed: int) -> None:
    n = 80
    u, v, _ = random_links(seed, n, 130)  # sparse: several components
    graph = sp.csr_matrix((np.ones(u.size), (u, v)), shape=(n, n))
    _, comp = connected_components(graph, directed=True, connection="strong")
    for start in (0, 7, 42):
        want = comp == comp[start]
        np.testing.assert_array_equal(strongly_connected_to(n, u, v, start), want)


def test_a_large_graph_goes_to_scipy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shortest, "PY_MAX_LINKS", 10)
    n = 40
    u, v, w = random_links(2, n, 100)
    assert Distances(n, u, v, w).python_runs == 0
    graph = sp.csr_matrix((np.ones(u.size), (u, v)), shape=(n, n))
    _, comp = connected_components(graph, directed=True, connection="strong")
    np.testing.assert_array_equal(strongly_connected_to(n, u, v, 3), comp == comp[3])
