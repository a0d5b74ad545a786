"""The fluid flow model: sharing, staggered arrivals, conservation, edge cases."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
import pytest
import simpy
from simpy_helpers import finish_times

from clustersim.errors import PartitionError
from clustersim.network.fabric import Topology, build_topology, chip_node
from clustersim.network.flows import FlowNetwork

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
        chips = rng.integers(0, 32, (int(rng.integers(1, 6)), 2))
        pairs = [(int(a), int(b)) for a, b in chips]
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


# -- link state changes in flight ------------------------------------------------------------


def at(env: simpy.Environment, t: float, fn: Any) -> None:
    def proc() -> Generator[simpy.Event, Any, None]:
        yield env.timeout(t)
        fn()

    env.process(proc())


def test_lane_loss_slows_exactly_the_flows_crossing_it() -> None:
    topo = line(lanes=4)
    (degraded,) = topo.route(0, 1)
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    crossing = net.transfer([(0, 1)], 1e9, 0.0)
    other = net.transfer([(1, 2)], 1e9, 0.0)
    at(env, 0.5, lambda: topo.set_lanes_up(degraded, 3))
    t_crossing, t_other = finish_times(env, [crossing, other])
    assert topo.capacity_Bps[degraded] == pytest.approx(0.75 * CAP)
    assert t_crossing == pytest.approx(0.5 + 0.5e9 / (0.75 * CAP), rel=1e-12)
    assert t_other == pytest.approx(1e9 / CAP, rel=1e-12)
    assert net.bytes_moved == pytest.approx(2e9, rel=1e-12)
    assert topo.route(0, 1) == (degraded,)  # a degraded hop stays up


def test_capacity_changed_is_idempotent() -> None:
    topo = line()
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    done = net.transfer([(0, 2)], 1e9, 0.0)
    at(env, 0.25, net.capacity_changed)
    at(env, 0.25, net.capacity_changed)
    (t,) = finish_times(env, [done])
    assert t == pytest.approx(1.0, rel=1e-12)


def test_link_down_in_flight_reroutes_the_transfer(specs: Any) -> None:
    topo = build_topology(specs.instance(), specs.chip(), 1)
    (direct,) = topo.route(0, 1)
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    nbytes = 1e9
    done = net.transfer([(0, 1)], nbytes, 0.0)
    at(env, 0.004, lambda: topo.set_link_state(direct, "down"))
    (t,) = finish_times(env, [done])
    assert net.reroutes == 1
    assert t == pytest.approx(nbytes / specs.link_Bps, rel=1e-12)  # the detour is as wide
    assert net.link_bytes[direct] == pytest.approx(0.004 * specs.link_Bps, rel=1e-9)
    detour = topo.route(0, 1)
    assert len(detour) == 3
    for link in detour:
        assert net.link_bytes[link] == pytest.approx(nbytes - 0.004 * specs.link_Bps, rel=1e-9)
    assert net.bytes_moved == pytest.approx(nbytes, rel=1e-12)


def test_partition_in_flight_fails_the_transfer_instead_of_hanging() -> None:
    topo = line()
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    caught: list[BaseException] = []

    def waiter() -> Generator[simpy.Event, Any, None]:
        try:
            yield net.transfer([(0, 2)], 1e9, 0.0)
        except PartitionError as exc:
            caught.append(exc)

    env.process(waiter())
    survivor = net.transfer([(0, 1)], 1e9, 0.0)
    at(env, 0.5, lambda: topo.set_link_state(topo.route(1, 2)[0], "down"))
    (t,) = finish_times(env, [survivor])
    assert len(caught) == 1
    assert "cannot reach chip 2" in str(caught[0]) and "chip1->chip2" in str(caught[0])
    # Half the link until the failure, then all of it.
    assert t == pytest.approx(0.5 + (1e9 - 0.5 * CAP / 2) / CAP, rel=1e-12)


def test_link_utilisation_over_time() -> None:
    topo = line()
    env = simpy.Environment()
    net = FlowNetwork(env, topo, series_bins=16)
    net.transfer([(0, 1)], 1e9, 0.0)  # 1 s at full rate
    net.transfer([(1, 2)], 0.25e9, 0.0)  # 0.25 s
    env.run(until=2.0)
    util = net.link_utilisation(top=2)
    a, b = topo.route(0, 1)[0], topo.route(1, 2)[0]
    assert util.elapsed_s == pytest.approx(2.0)
    assert list(util.names) == list(topo.names)
    assert util.mean[a] == pytest.approx(0.5) and util.mean[b] == pytest.approx(0.125)
    assert util.peak[a] == pytest.approx(1.0) and util.peak[b] == pytest.approx(1.0)
    assert util.bytes[a] == pytest.approx(1e9) and util.bytes[b] == pytest.approx(0.25e9)
    assert util.top.tolist() == [a, b]
    assert util.kinds[a] == "neuronlink"
    widths = np.diff(util.edges_s)
    assert util.edges_s[0] == 0.0 and util.edges_s[-1] >= 2.0
    np.testing.assert_allclose(util.series @ widths, [1.0, 0.25], rtol=1e-9)  # time integrals
    busy = util.series[0][util.edges_s[1:] <= 1.0]
    assert busy.size and np.allclose(busy, 1.0)
    assert np.allclose(util.series[0][util.edges_s[:-1] >= 1.0], 0.0)


def test_utilisation_series_survives_long_horizons() -> None:
    """Bins double as the run grows: the series keeps max_bins bins and its integrals."""
    topo = line()
    env = simpy.Environment()
    net = FlowNetwork(env, topo, series_bins=8)

    def traffic() -> Generator[simpy.Event, Any, None]:
        for k in range(40):
            yield net.transfer([(0, 1)], 1e6 * (1 + k % 3), 0.0)
            yield env.timeout(1e-3 * (k + 1))

    env.process(traffic())
    env.run()
    util = net.link_utilisation(top=1)
    (a,) = topo.route(0, 1)
    assert util.top.tolist() == [a]
    assert util.series.shape[1] <= 8
    integral = float(util.series[0] @ np.diff(util.edges_s))
    assert integral == pytest.approx(util.mean[a] * util.elapsed_s, rel=1e-9)
    assert integral == pytest.approx(sum(1e6 * (1 + k % 3) for k in range(40)) / CAP, rel=1e-9)


@pytest.mark.parametrize("seed", [1, 2])
def test_conservation_and_capacity_under_failures_on_a_fat_tree(specs: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    inst = specs.instance()
    efa = inst.efa.model_copy(update={"fabric": "fat_tree", "radix": 16, "tiers": 3, "nics": 16})
    topo = build_topology(inst.model_copy(update={"efa": efa}), specs.chip(), 4)
    spine_links = np.flatnonzero(
        np.asarray([str(topo.node(int(u))[0]) == "leaf" for u in topo.link_u])
        & (topo.kinds == "efa")
        & np.asarray([str(topo.node(int(v))[0]) == "spine" for v in topo.link_v])
    )
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    expected = 0.0
    events = []
    for _ in range(80):
        chips = rng.integers(0, 64, (int(rng.integers(1, 5)), 2))
        pairs = [(int(a), int(b)) for a, b in chips]
        nbytes = float(rng.uniform(1e4, 1e6))
        events.append(net.transfer(pairs, nbytes, float(rng.uniform(0, 2e-4))))
        expected += nbytes * len(pairs)

    def failures() -> Generator[simpy.Event, Any, None]:
        for _ in range(12):
            yield env.timeout(float(rng.uniform(0, 2e-5)) + 0.5e-6)
            link = int(rng.choice(spine_links))
            if rng.random() < 0.5:
                topo.set_lanes_up(link, 0 if topo.lanes_up(link) else 1)
            else:
                topo.set_link_state(link, "up")

    over: list[float] = []

    def monitor() -> Generator[simpy.Event, Any, None]:
        while net.entities_done < len(events):
            over.append(float((net.load_Bps - topo.capacity_Bps * (1 + 1e-9)).max()))
            yield env.timeout(1e-6)

    env.process(failures())
    env.process(monitor())
    env.run()
    assert net.entities_done == len(events)
    assert net.bytes_moved == pytest.approx(expected, rel=1e-9)
    assert max(over) <= 0.0
