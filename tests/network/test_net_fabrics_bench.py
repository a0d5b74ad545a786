"""Build and solve times of UltraCluster-size fabrics (benchmarks: ``pytest -m benchmark -s``)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import simpy

from clustersim import catalog
from clustersim.network.fabric import build_topology
from clustersim.network.flows import FlowNetwork


@pytest.mark.benchmark
@pytest.mark.parametrize(
    ("instance", "fabric", "tiers", "radix", "count"),
    [
        ("trn2.48xlarge", "fat_tree", 3, 64, 1024),
        ("trn2.48xlarge", "rail", 3, 64, 1024),
        ("trn2u.48xlarge", "fat_tree", 3, 64, 1024),
        ("trn2.48xlarge", "fat_tree", 3, 128, 6400),
    ],
)
def test_ultracluster_build_and_solve(
    instance: str, fabric: str, tiers: int, radix: int, count: int
) -> None:
    efa = {"fabric": fabric, "tiers": tiers, "radix": radix}
    inst = catalog.instance(instance, {"efa": efa})
    chip = catalog.chip(inst.chip)
    start = time.perf_counter()
    topo = build_topology(inst, chip, count)
    build_s = time.perf_counter() - start
    n = 16_384
    src = np.arange(n)
    pairs = tuple(zip(src.tolist(), ((src + 16) % topo.n_chips).tolist(), strict=True))
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    start = time.perf_counter()
    group = net.group(pairs)
    route_s = time.perf_counter() - start
    net.transfer_group(group, 1e6, 0.0)
    start = time.perf_counter()
    env.run()
    coflow_s = time.perf_counter() - start
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    groups = [net.group((pair,)) for pair in pairs]
    for i, g in enumerate(groups):
        net.transfer_group(g, 1e6 * (1 + i % 7), 0.0)
    start = time.perf_counter()
    env.step()  # the zero-delay solve of all 16,384 arrivals
    env.step()
    first_solve_s = time.perf_counter() - start
    env.run()
    print(
        f"\n{instance} x{count} ({topo.n_chips} chips, {topo.n_links} links), {tiers}-tier "
        f"{fabric} radix {radix}: build {build_s:.3f} s; 16,384 pairs routed in "
        f"{route_s * 1e3:.0f} ms; one 16,384-flow coflow solved in {coflow_s * 1e3:.0f} ms; "
        f"16,384 single-flow transfers: first solve {first_solve_s * 1e3:.0f} ms, "
        f"{net.solves} solves in all"
    )
