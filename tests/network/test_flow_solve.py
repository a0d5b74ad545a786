"""The flow model's solve shortcuts give what the plain computation gives."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import simpy
from simpy_helpers import finish_times

from clustersim.network.fabric import Topology, chip_node
from clustersim.network.flows import (
    FlowGroup,
    FlowNetwork,
    LinkStats,
    LoadPattern,
    Scratch,
    SharedHbm,
    maxmin_rates_reference,
    solve_groups,
    union,
)
from clustersim.network.flows.classes import classes_of

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
    """Solutions of 1, 1 and 2 links, two kept at most: each new one pushes out the one
    used longest ago (b, then c), never a, solved first but used in between; the link
    budget counts what the solutions hold of their own."""
    topo = line(4)
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    net.max_memo_entries = 2
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
    assert net._memo_links == sum(p.size for _, p in net._memo.values())
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
    got = np.zeros(n)
    for col, rate in zip(pattern.columns, pattern.rates, strict=True):
        got[col.links] += col.counts * rate
    np.testing.assert_allclose(got, load, rtol=1e-9)
    # The links several distinct groups cross, with their utilisation.
    crossing = np.zeros(n)
    for col in pattern.columns:
        crossing[col.links] += 1
    np.testing.assert_array_equal(pattern.shared, np.flatnonzero(crossing > 1))
    shared_cap = topo.capacity_Bps[pattern.shared]
    np.testing.assert_allclose(pattern.shared_util, load[pattern.shared] / shared_cap, rtol=1e-9)


class _Col:
    def __init__(self, links: list[int], counts: list[float]) -> None:
        self.links = np.asarray(links, dtype=np.int64)
        self.counts = np.asarray(counts, dtype=np.float64)


def test_bins_add_up_each_columns_load_on_its_links() -> None:
    """Two patterns over columns that share link 4, one held twice at once: each link's
    busy time is the sum of its columns' loads over capacity, times how long."""
    stats = LinkStats(10, start_s=0.0, max_bins=4, capacity_Bps=np.full(10, 2.0))
    x, y = _Col([1, 4, 7], [1.0, 1.0, 2.0]), _Col([4, 5, 9], [2.0, 1.0, 1.0])
    a = LoadPattern((x,), (1.0,))
    b = LoadPattern((y,), (1.0,))
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
    np.testing.assert_allclose(stats.bytes, 2.0 * stats.busy_s, rtol=1e-12)
    np.testing.assert_allclose(stats.peak, [0, 0.5, 0, 0, 1.0, 0.5, 0, 1.0, 0, 0.5])


def test_peaks_of_shared_links_come_from_the_pattern() -> None:
    """Where two columns of one pattern meet, the peak is their sum (as the solve gives it);
    elsewhere each column's highest rate."""
    stats = LinkStats(4, start_s=0.0, max_bins=4, capacity_Bps=np.full(4, 4.0))
    x, y = _Col([0, 1], [1.0, 1.0]), _Col([1, 2], [1.0, 2.0])
    stats.hold(0, 0.0, LoadPattern((x, y), (1.0, 1.0), np.asarray([1]), np.asarray([0.5])))
    stats.hold(0, 1.0, LoadPattern((x,), (3.0,)))
    stats.hold(0, 2.0, None)
    stats.settle()
    np.testing.assert_allclose(stats.peak, [0.75, 0.75, 0.5, 0.0])
    np.testing.assert_allclose(stats.bytes, [4.0, 5.0, 2.0, 0.0])


def test_capacity_changes_close_an_epoch() -> None:
    """Utilisation integrates load over the capacity of the time, through a change."""
    stats = LinkStats(2, start_s=0.0, max_bins=4, capacity_Bps=np.asarray([2.0, 2.0]))
    pattern = LoadPattern((_Col([0, 1], [1.0, 1.0]),), (1.0,))
    stats.hold(0, 0.0, pattern)
    stats.advance_to(1.0)
    stats.set_capacity(np.asarray([1.0, 0.0]))  # link 1 is down: no utilisation there
    stats.hold(0, 3.0, None)
    stats.settle()
    np.testing.assert_allclose(stats.busy_s, [0.5 + 2.0, 0.5])
    edges, series = stats.series(np.arange(2))
    np.testing.assert_allclose(series @ np.diff(edges), stats.busy_s, rtol=1e-12)


@pytest.mark.parametrize("spread", [False, True])
@pytest.mark.parametrize("n_links", [20, 5000])
def test_series_keep_every_links_integral_as_bins_double(n_links: int, spread: bool) -> None:
    """Bins merge pairwise as the run grows; every link's series still integrates to its
    busy time, also once the bins are spread over their links (a budget of columns)."""
    rng = np.random.default_rng(n_links)
    stats = LinkStats(n_links, start_s=0.0, max_bins=4, capacity_Bps=np.ones(n_links))
    if spread:
        stats.max_pinned_links = 16
    patterns = []
    for _ in range(5):
        links = np.unique(rng.choice(n_links, size=8, replace=False)).astype(np.int64)
        col = _Col(links.tolist(), rng.uniform(0.1, 1.0, links.size).tolist())
        patterns.append(LoadPattern((col,), (float(rng.uniform(0.5, 2.0)),)))
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
    if spread:
        assert stats._spread and stats._pinned_links <= 16


@pytest.mark.parametrize("n_links", [20, 5000])  # merged through a dense row; sorted
def test_spread_bins_read_as_the_columns_do(n_links: int) -> None:
    """Bins spread over their links (one bin at a time) give every link's series and
    totals as the bins that keep their columns do, and hold each link once per bin."""
    rng = np.random.default_rng(7)
    cols = []
    for _ in range(6):
        links = np.unique(rng.choice(n_links, size=12, replace=False)).astype(np.int64)
        cols.append(_Col(links.tolist(), rng.uniform(0.1, 1.0, links.size).tolist()))
    runs = []
    for budget in (None, 24):
        stats = LinkStats(n_links, start_s=0.0, max_bins=8, capacity_Bps=np.full(n_links, 2.0))
        stats.max_pinned_links = budget
        t, draw = 0.0, np.random.default_rng(3)
        for k in range(80):
            pick = draw.choice(6, size=2, replace=False)
            rates = draw.uniform(0.5, 2.0, 2).tolist()
            pattern = LoadPattern([cols[int(i)] for i in pick], rates)
            stats.hold(k % 4, t, pattern)
            t += float(draw.uniform(0.01, 0.3)) * (1 + k // 20)
        stats.hold(0, t, None)
        stats.advance_to(t)
        stats.settle()
        runs.append((stats, *stats.series(np.arange(n_links))))
    (kept, edges, series), (spread, edges_s, series_s) = runs
    assert not kept._spread and spread._spread
    for _, links, _ in spread._spread:
        assert np.all(np.diff(links) > 0)
    np.testing.assert_array_equal(edges, edges_s)
    np.testing.assert_allclose(series_s, series, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(spread.busy_s, kept.busy_s, rtol=1e-12)
    np.testing.assert_array_equal(spread.peak, kept.peak)


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


def _random_groups(
    rng: np.random.Generator, n_links: int, n_groups: int, kinds: int
) -> tuple[FlowGroup, ...]:
    """Groups over overlapping random links, with counts from ``kinds`` values (so links
    fall into few classes), some with a rate ceiling."""
    out = []
    for _ in range(n_groups):
        size = int(rng.integers(1, n_links // 2))
        links = np.unique(rng.choice(n_links, size=size, replace=False)).astype(np.int64)
        counts = rng.integers(1, kinds + 1, size=links.size).astype(np.float64)
        ceiling = float(rng.uniform(0.05, 0.5) * CAP) if rng.random() < 0.25 else np.inf
        out.append(FlowGroup(links, counts, int(counts.sum()), 0.0, (), ceiling))
    return tuple(out)


@pytest.mark.parametrize("kinds", [1, 3, 200])  # few classes; many (past MAX_CLASSES)
@pytest.mark.parametrize("seed", range(8))
def test_the_class_solve_is_the_per_link_solve(seed: int, kinds: int) -> None:
    """Over the shared links and each group's tightest class of private links, the rates
    and loads are those of progressive filling over every link, to the last bit."""
    rng = np.random.default_rng(seed)
    n = 400
    cap = rng.choice([CAP, 2 * CAP, 0.5 * CAP], size=n)
    distinct = _random_groups(rng, n, int(rng.integers(2, 6)), kinds)
    groups = tuple(distinct[i] for i in rng.integers(0, len(distinct), size=7))
    base = 380 if seed % 2 else None  # the last links as HBM rows: left out of the loads
    want_rates, want = solve_groups(groups, cap, base, lambda x: [], Scratch())
    got_rates, got = solve_groups(groups, cap, base, lambda x: [], Scratch(), classes=True)
    np.testing.assert_array_equal(got_rates, want_rates)
    np.testing.assert_array_equal(got.shared, want.shared)
    np.testing.assert_array_equal(got.shared_util, want.shared_util)
    assert got.rates == want.rates and got.columns == want.columns


def test_links_of_one_class_are_not_merged_when_one_is_shared() -> None:
    """Group a crosses links 1 and 2 alike (one class), and b crosses link 2: link 2 is
    shared and holds both at half its capacity, though link 1 of the same class is a's
    alone. Link 3 has a's ratio of capacity to flows but another capacity: its own class."""
    cap = np.asarray([CAP, CAP, CAP, 2 * CAP])
    a = FlowGroup(np.asarray([1, 2]), np.asarray([1.0, 1.0]), 1, 0.0)
    b = FlowGroup(np.asarray([2, 3]), np.asarray([1.0, 2.0]), 1, 0.0)
    for classes in (False, True):
        rates, pattern = solve_groups((a, b), cap, None, lambda x: [], classes=classes)
        np.testing.assert_array_equal(rates, [CAP / 2, CAP / 2])
        np.testing.assert_array_equal(pattern.shared, [2])
        np.testing.assert_array_equal(pattern.shared_util, [1.0])
    (found,) = [classes_of(cap[g.links], g.counts) for g in (a,)]
    assert found is not None and found.size.tolist() == [2]  # links 1 and 2: one class
    other = classes_of(cap[b.links], b.counts)
    assert other is not None and other.size.tolist() == [1, 1]  # same ratio, two classes
    # Three of a's entities and one of b: a is held by link 2 at a quarter each.
    rates, _ = solve_groups((a, a, a, b), cap, None, lambda x: [], classes=True)
    np.testing.assert_array_equal(rates, [CAP / 4] * 4)
