"""Routing in bulk: domain tables and transfer chains give what the per-pair path gives."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from clustersim import catalog
from clustersim.network.fabric import build_topology, distinct_pairs
from clustersim.network.fabric.domainpaths import _strided
from clustersim.network.flows import FlowNetwork, link_counts


@pytest.mark.parametrize(("instance", "count"), [("trn2.48xlarge", 3), ("trn2u.48xlarge", 8)])
def test_domain_table_routes_are_the_path_functions(instance: str, count: int) -> None:
    inst = catalog.instance(instance)
    topo = build_topology(inst, catalog.chip(inst.chip), count)
    assert topo.local_paths is not None
    rng = np.random.default_rng(1)
    cpd = topo.chips_per_domain
    src = rng.integers(0, topo.n_chips, 2000)
    dst = src - src % cpd + rng.integers(0, cpd, 2000)  # same domain, some to themselves
    routes = [topo.route(int(a), int(b)) for a, b in zip(src, dst, strict=True)]
    flat, _, latency = topo.weighted_routes(src, dst)
    assert sorted(flat.tolist()) == sorted(x for r in routes for x in r)
    assert sorted(latency.tolist()) == sorted(topo._latencies(routes).tolist())


@pytest.mark.parametrize(("instance", "count"), [("trn2.48xlarge", 12), ("trn2u.48xlarge", 40)])
def test_domain_links_guessed_at_a_stride_are_the_links_between_their_chips(
    instance: str, count: int
) -> None:
    inst = catalog.instance(instance)
    topo = build_topology(inst, catalog.chip(inst.chip), count)
    paths = topo.local_paths
    assert paths is not None
    domains = np.arange(1, topo.n_domains, 2)  # every other domain: a stride of two
    table = paths.domain_links(domains, topo.links_between, topo.n_domains, check=topo.are_links)
    cpd = topo.chips_per_domain
    hop = paths.hop_of()
    a, b = np.divmod(np.flatnonzero(hop >= 0), cpd)
    for d in range(topo.n_domains):
        expected = topo.links_between(d * cpd + a, d * cpd + b) if d % 2 else -1
        assert (table[d, hop[a * cpd + b]] == expected).all()


def test_strided_guesses_that_miss_are_looked_up() -> None:
    """Domains whose links were not added alike (here: two with their hops reversed) are
    looked up; a stride the first two domains do not share is not guessed."""
    n_domains, hops = 9, 5
    ids = np.arange(n_domains * hops).reshape(n_domains, hops)
    ids[[4, 7]] = ids[[4, 7], ::-1]
    ids[1, :2] = ids[1, 1::-1]
    u = np.arange(n_domains)[:, None] * 100 + np.arange(hops)
    v = u + 1
    owner = {
        (int(x), int(y)): int(i) for x, y, i in zip(u.ravel(), v.ravel(), ids.ravel(), strict=True)
    }
    asked: list[int] = []

    def find(uu: np.ndarray, vv: np.ndarray) -> np.ndarray:
        asked.append(uu.size)
        return np.asarray([owner[int(x), int(y)] for x, y in zip(uu, vv, strict=True)])

    def check(links: np.ndarray, uu: np.ndarray, vv: np.ndarray) -> np.ndarray:
        return np.asarray(
            [owner.get((int(x), int(y))) == i for i, x, y in zip(links, uu, vv, strict=True)]
        )

    domains = np.arange(n_domains)
    assert _strided(domains, u, v, find, check) is None  # domains 0 and 1: no common stride
    found = _strided(domains[2:], u[2:], v[2:], find, check)
    assert found is not None and (found == ids[2:]).all()
    assert asked[-1] == 2 * (hops - 1)  # domains 4 and 7 but their middle hops looked up


@pytest.mark.parametrize(("domains", "n"), [(1, 700), (3, 150)])  # a count per pair; a sort
def test_distinct_pairs_weighted_count_what_every_pair_routed_counts(domains: int, n: int) -> None:
    inst = catalog.instance("trn2.48xlarge")
    topo = build_topology(inst, catalog.chip(inst.chip), 3)
    rng = np.random.default_rng(2)
    cpd = topo.chips_per_domain
    src = rng.integers(0, domains * cpd, n)
    dst = src - src % cpd + rng.integers(0, cpd, n)
    s, d, times = distinct_pairs(src, dst, topo.chip_domain[src], cpd, topo.n_domains)
    assert int(times.sum()) == src.size and np.unique(s * topo.n_chips + d).size == s.size
    found = zip(s.tolist(), d.tolist(), times.tolist(), strict=True)
    merged = [(a, b) for a, b, k in found for _ in range(k)]
    assert sorted(merged) == sorted(zip(src.tolist(), dst.tolist(), strict=True))
    flat, weights, latency = topo.weighted_routes(s, d, times)
    links, counts = link_counts(flat, weights)
    all_links, all_counts = link_counts(topo.weighted_routes(src, dst)[0], None)
    assert links.tolist() == all_links.tolist() and counts.tolist() == all_counts.tolist()
    assert latency.max() == topo.weighted_routes(src, dst)[2].max()


def test_routes_with_a_link_down_avoid_it() -> None:
    inst = catalog.instance("trn2.48xlarge")
    topo = build_topology(inst, catalog.chip(inst.chip), 1)
    first = topo.route(0, 2)
    topo.set_lanes_up(first[0], 0)
    flat, _, _ = topo.weighted_routes(np.asarray([0]), np.asarray([2]))
    assert first[0] not in flat.tolist()


def test_a_chain_runs_its_steps_one_after_another() -> None:
    inst = catalog.instance("trn2.48xlarge")
    topo = build_topology(inst, catalog.chip(inst.chip), 1)
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    a, b = net.group(((0, 1),)), net.group(((1, 2), (2, 1)))
    rate_a = float((topo.capacity_Bps[a.links] / a.counts).min())
    rate_b = float((topo.capacity_Bps[b.links] / b.counts).min())
    done = net.transfer_chain([(a, 1e6, 1e-6), (b, 2e6, 2e-6), (a, 0.0, 0.0)])
    env.run(until=done)
    assert env.now == pytest.approx(1e-6 + 1e6 / rate_a + 2e-6 + 2e6 / rate_b, rel=1e-12)
    assert net.entities_done == 3 and net.transfers == 3
