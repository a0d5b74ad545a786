"""Routing in bulk: domain tables and transfer chains give what the per-pair path gives."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from clustersim import catalog
from clustersim.network.fabric import build_topology, distinct_pairs
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
