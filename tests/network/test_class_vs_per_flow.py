"""The flow model's solve of a collective step against a solve of each flow on its own.

A step of a collective is one entity of the flow model: every flow of it moves at
one rate, solved over the links its flows share with other steps and each step's
tightest class of private links (:mod:`clustersim.network.flows.classes`). Solved
flow by flow instead (a column per flow, max-min fair), the slowest flow gets
that same rate: it is the lowest ratio of a link's capacity to the flows on it,
the first level of progressive filling. Where the step is symmetric (every flow
meets the same bottleneck) every flow gets it, so the step ends when each flow
of a per-flow fluid run ends. Elsewhere (an ECMP collision, a ring with a link
down) the other flows go faster, and a per-flow run ends no later than the step.

Checked for every collective algorithm that runs over a fabric's own links on
every fabric builder, built and imported as a graph, and on imported rings and
switches; pairs of steps in flight together are solved by classes as over every
link, to the last bit.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import simpy
from test_graph_export import FAMILIES, family_topology
from test_route_loads import NEURON_ALGORITHMS, imported, shaped

from clustersim.network import Network
from clustersim.network.fabric import Topology
from clustersim.network.flows.entity import FlowGroup
from clustersim.network.flows.maxmin import maxmin_rates_csc
from clustersim.network.flows.solve import Scratch, solve_groups

NBYTES = 2.0**24
RTOL = 1e-9
FAST_FAMILIES = ["fat_tree", "torus2d"]


def per_flow_rates(topo: Topology, pairs: np.ndarray) -> np.ndarray:
    """Max-min rates of the flows ``pairs`` (chips), a column per flow: each flow is its
    own entity over its route (its NIC ports' paths, each at its share)."""
    columns = []
    for src, dst in pairs.tolist():
        flat, weights, _ = topo.weighted_routes(np.asarray([src]), np.asarray([dst]))
        w = np.ones(flat.size) if weights is None else weights
        links, at = np.unique(flat, return_inverse=True)
        columns.append((links, np.bincount(at.ravel(), weights=w)))
    indptr = np.zeros(len(columns) + 1, dtype=np.int64)
    np.cumsum([c[0].size for c in columns], out=indptr[1:])
    rows = np.concatenate([c[0] for c in columns])
    counts = np.concatenate([c[1] for c in columns])
    return maxmin_rates_csc(indptr, rows, counts, topo.capacity_Bps)


def per_flow_time(topo: Topology, pairs: np.ndarray, nbytes: float) -> float:
    """When the last of ``pairs``' flows of ``nbytes`` each ends, rates solved again flow by
    flow at each departure (a fluid run with no latency)."""
    left = np.full(pairs.shape[0], nbytes)
    now = 0.0
    live = np.arange(pairs.shape[0])
    while live.size:
        rates = per_flow_rates(topo, pairs[live])
        dt = float((left[live] / rates).min())
        now += dt
        left[live] -= rates * dt
        live = live[left[live] > nbytes * 1e-12]
    return now


def class_rate(groups: tuple[FlowGroup, ...], cap: np.ndarray, classes: bool) -> np.ndarray:
    rates, _ = solve_groups(groups, cap, None, lambda x: [], Scratch(), classes=classes)
    return rates


def steps_of(topo: Topology, op: str, alg: str) -> list[np.ndarray]:
    """The chip pairs of each step of ``op`` by ``alg`` over every chip, one rank per chip."""
    net = Network(simpy.Environment(), topo, range(topo.n_chips), {op: alg})
    _, steps = net._steps_of(op, tuple(range(topo.n_chips)), NBYTES)
    return [pairs for _, pairs, _ in steps if pairs.size]


def check_steps(topo: Topology, op: str, alg: str) -> None:
    net = Network(simpy.Environment(), topo, range(topo.n_chips))
    cap = net.flows._cap()
    groups = []
    for pairs in steps_of(topo, op, alg):
        group = net.flows.group(pairs)
        groups.append(group)
        (rate,) = class_rate((group,), cap, classes=True)
        flows = per_flow_rates(topo, pairs)
        assert rate == pytest.approx(float(flows.min()), rel=RTOL), (op, alg)
        if flows.max() <= flows.min() * (1 + RTOL):  # symmetric: every flow ends with the step
            assert per_flow_time(topo, pairs, NBYTES) == pytest.approx(NBYTES / rate, rel=RTOL)
    for a, b in itertools.pairwise(groups):  # two steps in flight together
        np.testing.assert_array_equal(
            class_rate((a, b), cap, classes=True), class_rate((a, b), cap, classes=False)
        )


def family_cases(families: list[str]) -> list[tuple[str, bool, str, str]]:
    return [
        (family, graph, op, alg)
        for family in families
        for graph in (False, True)
        for op, alg in NEURON_ALGORITHMS
    ]


def run_case(family: str, graph: bool, op: str, alg: str) -> None:
    topo = imported(family) if graph else family_topology(family)
    check_steps(topo, op, alg)


@pytest.mark.parametrize(("family", "graph", "op", "alg"), family_cases(FAST_FAMILIES))
def test_every_algorithm_solves_as_its_slowest_flow(
    family: str, graph: bool, op: str, alg: str
) -> None:
    run_case(family, graph, op, alg)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "graph", "op", "alg"),
    family_cases(sorted(set(FAMILIES) - set(FAST_FAMILIES))),
)
def test_every_family_and_algorithm_solves_as_its_slowest_flow(
    family: str, graph: bool, op: str, alg: str
) -> None:
    run_case(family, graph, op, alg)


@pytest.mark.parametrize(("shape", "alg"), [("ring", "mesh"), ("switch", "mesh"), ("ring", "ring")])
def test_imported_rings_and_switches(shape: str, alg: str) -> None:
    op = "all_to_all" if alg == "mesh" else "all_reduce"
    check_steps(shaped(shape, 32), op, alg)


def test_a_symmetric_step_ends_with_every_flow() -> None:
    """An all-to-all step on an imported switch: every flow has the step's rate, and a
    per-flow fluid run ends when the step does."""
    topo = shaped("switch", 32)
    net = Network(simpy.Environment(), topo, range(topo.n_chips))
    (pairs, *_) = steps_of(topo, "all_to_all", "mesh")
    (rate,) = class_rate((net.flows.group(pairs),), net.flows._cap(), classes=True)
    flows = per_flow_rates(topo, pairs)
    np.testing.assert_allclose(flows, rate, rtol=RTOL)
    assert per_flow_time(topo, pairs, NBYTES) == pytest.approx(NBYTES / rate, rel=RTOL)


def test_an_asymmetric_step_is_paced_by_its_slowest_flow() -> None:
    """With a ring link at half its capacity, a ring step's flows are not alike: the step
    runs at its slowest flow's rate, and a per-flow run, whose other flows go faster, ends
    no later."""
    topo = shaped("ring", 32)
    link = int(topo.links_between(np.asarray([0]), np.asarray([1]))[0])
    topo.set_capacity_factor(link, 0.5)
    net = Network(simpy.Environment(), topo, range(topo.n_chips))
    (pairs, *_) = steps_of(topo, "all_reduce", "ring")
    (rate,) = class_rate((net.flows.group(pairs),), net.flows._cap(), classes=True)
    flows = per_flow_rates(topo, pairs)
    assert rate == pytest.approx(float(flows.min()), rel=RTOL)
    assert flows.max() > 1.5 * flows.min()
    assert per_flow_time(topo, pairs, NBYTES) <= NBYTES / rate * (1 + RTOL)
