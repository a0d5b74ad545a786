"""The flow model's solve shortcuts give what the plain computation gives."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import simpy
from simpy_helpers import finish_times

from clustersim.network.entity import FlowGroup
from clustersim.network.flows import FlowNetwork
from clustersim.network.hbm import SharedHbm
from clustersim.network.linkstats import LinkStats, LoadPattern
from clustersim.network.maxmin import maxmin_rates_reference
from clustersim.network.solve import Scratch, union
from clustersim.network.topology import Topology, chip_node

CAP = 1e9


def line(n: int) -> Topology:
    topo = Topology("line", chips_per_instance=n, local_bw_Bps=10 * CAP)
    for i in range(n - 1):
        topo.add_duplex(
            chip_node(i), chip_node(i + 1), capacity_Bps=CAP, latency_s=0.0, kind="neuronlink"
        )
    return topo


@pytest.mark.parametrize("size", [7, 300, 5000])
def test_union_is_np_unique_with_its_inverse(size: int) -> None:
    n = 200
    scratch = Scratch()
    rng = np.random.default_rng(size)
    for _ in range(3):  # the scratch slots are reused between calls
        flat = rng.integers(0, n, size=size, dtype=np.int64)
        loaded, rows = union(flat, scratch, n)
        want, inverse = np.unique(flat, return_inverse=True)
        np.testing.assert_array_equal(loaded, want)
        np.testing.assert_array_equal(rows, inverse.ravel())


def test_transfers_of_one_group_share_like_distinct_ones() -> None:
    """Three transfers of one group (0 -> 2) and one of 1 -> 2: link 1 -> 2 carries
    four entities, a quarter of its capacity each."""
    env = simpy.Environment()
    net = FlowNetwork(env, line(3))
    same = [net.transfer([(0, 2)], 1e6, 0.0) for _ in range(3)]
    times = finish_times(env, [*same, net.transfer([(1, 2)], 1e6, 0.0)])
    assert times == pytest.approx([4e6 / CAP] * 4, rel=1e-12)


def test_the_solve_memo_forgets_the_least_recently_used_solution() -> None:
    """Solutions of 1, 1 and 2 links over a budget of 3: each new one pushes out the one
    used longest ago (b, then c), never a, solved first but used in between; the budget
    counts what is kept."""
    topo = line(4)
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    net.max_memo_links = 3
    a, b, c = net.group(((0, 1),)), net.group(((1, 2),)), net.group(((1, 3),))
    solved = []
    orig = net._solve_groups

    def counted(groups: tuple[FlowGroup, ...]) -> tuple[object, LoadPattern]:
        solved.append(groups)
        return orig(groups)

    net._solve_groups = counted  # type: ignore[method-assign]
    for group in (a, b, a, c, a, b):
        env.run(until=net.transfer_group(group, 1e6, 0.0))
    assert solved == [(a,), (b,), (c,), (b,)]
    assert net._memo_links == sum(p.links.size for _, p in net._memo.values()) <= 3
    assert list(net._memo) == [(a,), (b,)]


@pytest.mark.parametrize("seed", range(6))
def test_repeated_groups_solve_as_the_whole_system(seed: int) -> None:
    """Entities that repeat a group (with or without a rate ceiling) get the rates of
    progressive filling over every entity's own column."""
    rng = np.random.default_rng(seed)
    topo = line(12)
    net = FlowNetwork(simpy.Environment(), topo)
    n = topo.n_links
    distinct = []
    for _ in range(4):
        links = np.unique(rng.choice(n, size=rng.integers(1, 6), replace=False)).astype(np.int64)
        counts = rng.integers(1, 4, size=links.size).astype(np.float64)
        ceiling = float(rng.uniform(0.05, 0.5) * CAP) if rng.random() < 0.3 else np.inf
        distinct.append(FlowGroup(links, counts, int(counts.sum()), 0.0, (), ceiling))
    groups = tuple(distinct[i] for i in rng.integers(0, 4, size=9))
    rates, pattern = net._solve_groups(groups)
    # The reference: one column per entity, a private link per ceiling.
    cap = list(topo.capacity_Bps)
    columns = []
    for g in groups:
        col = np.zeros(n)
        col[g.links] = g.counts
        columns.append(col)
    extra = [(e, g.rate_cap_Bps) for e, g in enumerate(groups) if g.rate_cap_Bps < np.inf]
    dense = np.zeros((n + len(extra), len(groups)))
    dense[:n] = np.stack(columns, axis=1)
    for row, (e, ceiling) in enumerate(extra):
        dense[n + row, e] = 1.0
        cap.append(ceiling)
    want = maxmin_rates_reference(sp.csr_matrix(dense), np.asarray(cap))
    np.testing.assert_allclose(rates, want, rtol=1e-9)
    load = dense[:n] @ want
    np.testing.assert_allclose(load[pattern.links], pattern.load, rtol=1e-9)
    assert set(pattern.links.tolist()) == set(np.flatnonzero(load).tolist())


def test_bins_close_over_every_link_a_pattern_touched() -> None:
    """A bin records each link once, however many patterns (and repeats) touched it."""
    stats = LinkStats(10, start_s=0.0, max_bins=4)
    cap = np.full(3, 2.0)
    a = LoadPattern(np.asarray([1, 4, 7]), np.asarray([1.0, 1.0, 2.0]), cap)
    b = LoadPattern(np.asarray([4, 5, 9]), np.asarray([2.0, 1.0, 1.0]), cap)
    stats.hold(0, 0.0, a)
    stats.hold(1, 0.0, b)
    stats.hold(0, 1.0, b)  # the same pattern held twice at once
    stats.advance_to(8.0)  # the first load sets the width (4 s): the first bin closes
    stats.settle()
    edges, series = stats.series(np.arange(10))
    busy = series @ np.diff(edges)
    np.testing.assert_allclose(busy, stats.busy_s, rtol=1e-12)
    np.testing.assert_allclose(
        stats.busy_s, [0, 0.5, 0, 0, 0.5 + 8 + 7, 4 + 3.5, 0, 1.0, 0, 4 + 3.5], rtol=1e-12
    )


@pytest.mark.parametrize("n_links", [20, 5000])
def test_series_keep_every_links_integral_as_bins_double(n_links: int) -> None:
    """Bins merge pairwise as the run grows (by a dense sum over few links, by a sort
    over many); every link's series still integrates to its busy time."""
    rng = np.random.default_rng(n_links)
    stats = LinkStats(n_links, start_s=0.0, max_bins=4)
    patterns = []
    for _ in range(5):
        links = np.unique(rng.choice(n_links, size=8, replace=False)).astype(np.int64)
        patterns.append(LoadPattern(links, rng.uniform(0.1, 1.0, links.size), np.ones(links.size)))
    t = 0.0
    for k in range(60):
        stats.hold(k % 3, t, patterns[int(rng.integers(5))])
        t += float(rng.uniform(0.01, 0.2)) * (1 + k // 10)
    stats.hold(0, t, None)
    stats.advance_to(t)
    stats.settle()
    edges, series = stats.series(np.arange(n_links))
    assert series.shape[1] <= 4
    np.testing.assert_allclose(series @ np.diff(edges), stats.busy_s, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("only", [[3], [0, 5], list(range(9))])  # counted one by one; gathered
def test_hbm_counts_on_a_few_chips_are_those_on_every_chip(only: list[int]) -> None:
    hbm = SharedHbm(100, 1e12, 10)
    rng = np.random.default_rng(len(only))
    src, dst = rng.integers(0, 10, 500), rng.integers(0, 10, 500)
    links, counts = np.asarray([4, 7], dtype=np.int64), np.asarray([2.0, 1.0])
    got = hbm.add(links, counts, src, dst, np.asarray(only, dtype=np.int64))
    every_links, every_counts = hbm.add(links, counts, src, dst)
    mine = np.isin(every_links, [4, 7, *(100 + c for c in only)])
    np.testing.assert_array_equal(got[0], every_links[mine])
    np.testing.assert_array_equal(got[1], every_counts[mine])
