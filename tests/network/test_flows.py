"""The fluid flow model: sharing, staggered arrivals, conservation, edge cases."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
import pytest
import simpy

from clustersim.errors import PartitionError
from clustersim.network.flows import FlowNetwork
from clustersim.network.topology import Topology, build_topology, chip_node

CAP = 1e9
LAT = 1e-6


def line(n: int = 3, lanes: int = 1) -> Topology:
    """Chips 0 - 1 - ... - n-1 in a line, both directions."""
    topo = Topology("line", chips_per_instance=n, local_bw_Bps=10 * CAP)
    for i in range(n - 1):
        topo.add_duplex(
            chip_node(i),
            chip_node(i + 1),
            capacity_Bps=CAP,
            latency_s=LAT,
            lanes=lanes,
            kind="neuronlink",
        )
    return topo


def finish_times(env: simpy.Environment, events: list[simpy.Event]) -> list[float]:
    times: list[float] = [float("nan")] * len(events)
    for i, ev in enumerate(events):
        ev.callbacks.append(lambda _ev, i=i: times.__setitem__(i, env.now))
    env.run()
    return times


def test_one_transfer_costs_latency_plus_bytes_over_capacity() -> None:
    env = simpy.Environment()
    net = FlowNetwork(env, line())
    (t,) = finish_times(env, [net.transfer([(0, 2)], 1e6, 2 * LAT)])
    assert t == pytest.approx(2 * LAT + 1e6 / CAP, rel=1e-12)
    assert net.entities_done == 1
    assert net.solves == 1


def test_two_transfers_sharing_a_link_take_twice_as_long() -> None:
    env = simpy.Environment()
    net = FlowNetwork(env, line())
    times = finish_times(env, [net.transfer([(0, 1)], 1e6, 0.0), net.transfer([(0, 2)], 1e6, 0.0)])
    assert times == pytest.approx([2e6 / CAP, 2e6 / CAP], rel=1e-12)
    # Opposite directions do not share.
    env = simpy.Environment()
    net = FlowNetwork(env, line())
    times = finish_times(env, [net.transfer([(0, 1)], 1e6, 0.0), net.transfer([(1, 0)], 1e6, 0.0)])
    assert times == pytest.approx([1e6 / CAP, 1e6 / CAP], rel=1e-12)


def test_staggered_arrival_shares_from_its_arrival_on() -> None:
    env = simpy.Environment()
    net = FlowNetwork(env, line())
    a = net.transfer([(0, 1)], 1e9, 0.0)  # alone for 0.5 s, then at half rate
    b = net.transfer([(0, 1)], 1e9, 0.5)
    ta, tb = finish_times(env, [a, b])
    assert ta == pytest.approx(1.5, rel=1e-12)
    assert tb == pytest.approx(2.0, rel=1e-12)
    assert net.bytes_moved == pytest.approx(2e9, rel=1e-12)


def test_entity_with_many_flows_moves_at_one_rate() -> None:
    env = simpy.Environment()
    net = FlowNetwork(env, line())
    # Two flows of one entity on link 0->1; the entity's rate is CAP/2 per flow.
    (t,) = finish_times(env, [net.transfer([(0, 1), (0, 2)], 1e6, 0.0)])
    assert t == pytest.approx(2e6 / CAP, rel=1e-12)


def test_degraded_link_is_slower() -> None:
    topo = line(lanes=2)
    (link,) = topo.route(0, 1)
    topo.set_lanes_up(link, 1)
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    (t,) = finish_times(env, [net.transfer([(0, 1)], 1e6, 0.0)])
    assert t == pytest.approx(2e6 / CAP, rel=1e-12)


def test_zero_bytes_finishes_after_its_latency() -> None:
    env = simpy.Environment()
    net = FlowNetwork(env, line())
    times = finish_times(env, [net.transfer([(0, 2)], 0.0, 3e-6), net.transfer([], 5.0, 0.0)])
    assert times == [pytest.approx(3e-6), 0.0]
    assert net.entities_done == 2
    assert net.solves == 0


def test_simultaneous_completions_cost_one_solve() -> None:
    env = simpy.Environment()
    net = FlowNetwork(env, line(2))
    events = [net.transfer([(0, 1)], 1e6, 0.0) for _ in range(100)]
    events += [net.transfer([(1, 0)], 1e6, 0.0) for _ in range(100)]
    times = finish_times(env, events)
    assert times == pytest.approx([100e6 / CAP] * 200, rel=1e-12)
    assert net.solves == 1
    assert net.entities_done == 200


def test_bytes_are_conserved_and_no_link_is_over_capacity(specs: Any) -> None:
    rng = np.random.default_rng(7)
    topo = build_topology(specs.instance(), specs.chip(), 2)
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    expected_link = np.zeros(topo.n_links)
    expected_total = 0.0
    events = []
    for _ in range(60):
        pairs = [
            tuple(int(c) for c in rng.integers(0, 32, 2)) for _ in range(int(rng.integers(1, 6)))
        ]
        nbytes = float(rng.uniform(1e3, 1e7))
        delay = float(rng.uniform(0, 2e-4))
        events.append(net.transfer(pairs, nbytes, delay))
        for s, d in pairs:
            for link in topo.route(s, d):
                expected_link[link] += nbytes
        expected_total += nbytes * len(pairs)
    over: list[float] = []

    def monitor() -> Generator[simpy.Event, Any, None]:
        while net.entities_done < len(events):
            over.append(float((net.load_Bps - topo.capacity_Bps * (1 + 1e-9)).max()))
            yield env.timeout(1e-6)

    env.process(monitor())
    env.run()
    assert net.entities_done == 60
    assert net.bytes_moved == pytest.approx(expected_total, rel=1e-9)
    np.testing.assert_allclose(net.link_bytes, expected_link, rtol=1e-9, atol=1e-3)
    assert max(over) <= 0.0


def test_partition_error_on_a_cut_graph() -> None:
    topo = line()
    topo.set_link_state(topo.route(1, 2)[0], "down")
    net = FlowNetwork(simpy.Environment(), topo)
    with pytest.raises(PartitionError, match="chip 0 cannot reach chip 2"):
        net.transfer([(0, 1), (0, 2)], 1.0, 0.0)
