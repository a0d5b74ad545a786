"""A folded step on a tree fabric (distinct rows of chips, leaf links dropped by the pairs'
ends) loads the links that routing every replica's flow and masking the far chips' leaf
links gives, count for count."""

from __future__ import annotations

import numpy as np
import pytest
import simpy
from test_graph_export import family_topology

from clustersim.network import Network
from clustersim.network.fabric import Topology
from clustersim.network.flows.entity import link_counts
from clustersim.network.folded import distinct_rows

RANKS_PER_CHIP = 2


def folded(topo: Topology, op: str, alg: str) -> list[tuple[Network, np.ndarray, np.ndarray]]:
    """The folded groups of ``op`` over rows of ranks: ranks share chips, so the rows of
    two ranks of one chip are alike (each row spans every domain, one rank per chip)."""
    n = topo.n_chips
    chips = np.repeat(np.arange(n), RANKS_PER_CHIP)
    # Ranks 2c and 2c+1 are on chip c: row k holds rank 2c+k of every chip c.
    rows = np.stack([np.arange(n) * RANKS_PER_CHIP + k for k in range(RANKS_PER_CHIP)])
    net = Network(simpy.Environment(), topo, chips, {op: alg})
    ranks = tuple(int(r) for r in rows[0])
    _, steps = net._steps_of(op, ranks, 2.0**24)
    return [(net, rows, pairs) for _, pairs, _ in steps if pairs.size]


def expected(net: Network, rows: np.ndarray, pairs: np.ndarray) -> tuple[np.ndarray, ...]:
    """Every flow of every row routed, the far chips' leaf links masked out."""
    topo = net.topology
    chips = net.rank_chip[rows]
    src, dst = chips[:, pairs[:, 0]].ravel(), chips[:, pairs[:, 1]].ravel()
    flat, weights, latency = topo.weighted_routes(src, dst)
    near = np.zeros(topo.n_domains, dtype=bool)
    near[topo.chip_domain[chips[0]]] = True
    assert topo.scaleout is not None
    mine = ~net._far_hosts(near, topo.scaleout)[flat]
    links, counts = link_counts(flat[mine], None if weights is None else weights[mine])
    return links, counts, np.asarray(latency.max())


@pytest.mark.parametrize("family", ["fat_tree", "rail"])
@pytest.mark.parametrize(
    ("op", "alg"), [("all_reduce", "ring"), ("all_to_all", "mesh"), ("all_reduce", "auto")]
)
def test_tree_routes_are_every_flows_routes(family: str, op: str, alg: str) -> None:
    topo = family_topology(family)
    for net, rows, pairs in folded(topo, op, alg):
        group = net._folded_group(rows, tuple(int(r) for r in rows[0]), pairs, "test")
        links, counts, latency = expected(net, rows, pairs)
        np.testing.assert_array_equal(group.links, links)
        np.testing.assert_array_equal(group.counts, counts)
        assert group.latency_s == float(latency)
        assert group.n_flows == rows.shape[0] * pairs.shape[0]


def test_distinct_rows_count_their_copies() -> None:
    rows = np.asarray([[0, 1, 2], [3, 4, 5], [0, 1, 2], [0, 1, 2]])
    first, times = distinct_rows(rows, 6) or (None, None)
    assert first is not None and times is not None
    assert sorted(zip(first.tolist(), times.tolist(), strict=True)) == [(0, 3), (1, 1)]
    assert distinct_rows(rows[:2], 6) is None
    pairs = np.asarray([[0, 5], [1, 4], [0, 5], [2, 3]])
    first, times = distinct_rows(pairs, 6) or (None, None)
    assert first is not None and times is not None
    assert sorted(zip(first.tolist(), times.tolist(), strict=True)) == [(0, 2), (1, 1), (3, 1)]
