"""Failure injection on hand-built topologies: each kind against its closed form."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import simpy
from simpy_helpers import finish_times

from clustersim import catalog
from clustersim.errors import ScenarioError
from clustersim.failures.injection import (
    Injector,
    Slowdown,
    StepFailure,
    breaks_symmetry,
    fold_with,
    resolve,
)
from clustersim.network.fabric import Topology, build_topology, chip_node
from clustersim.network.flows import FlowNetwork
from clustersim.scenario.failures import Injection

CAP = 1e9
B = 1e6  # bytes: 1 ms at CAP


def pair(lanes: int = 2) -> Topology:
    """Two chips and one cable of ``lanes`` lanes, CAP per direction."""
    topo = Topology("pair", chips_per_instance=2, local_bw_Bps=10 * CAP)
    topo.add_duplex(
        chip_node(0), chip_node(1), capacity_Bps=CAP, latency_s=0.0, lanes=lanes, kind="neuronlink"
    )
    return topo


def ring(n: int = 4, lanes: int = 1) -> Topology:
    """Chips 0..n-1 in a ring; routes are lowest-latency paths (ties: fewer hops)."""
    topo = Topology("ring", chips_per_instance=n, local_bw_Bps=10 * CAP)
    for i in range(n):
        topo.add_duplex(
            chip_node(i),
            chip_node((i + 1) % n),
            capacity_Bps=CAP,
            latency_s=1e-6,
            lanes=lanes,
            kind="neuronlink",
        )
    return topo


def trn2(count: int) -> Topology:
    """``count`` trn2.48xlarge instances: 4x4 tori, joined by the non-blocking EFA switch."""
    return build_topology(catalog.instance("trn2.48xlarge"), catalog.chip("trn2"), count)


def inj(**kw: Any) -> Injection:
    return Injection.model_validate(kw)


def run_with(
    topo: Topology, injections: list[Injection], transfers: list[tuple[int, int]], *, delay: float
) -> tuple[list[float], FlowNetwork, Injector]:
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    injector = Injector(env, topo, resolve(injections, topo), detect_delay_s=delay)
    injector.start()
    events = [net.transfer([p], B, 0.0) for p in transfers]
    return finish_times(env, events), net, injector


def test_lane_down_halves_a_two_lane_link_in_flight() -> None:
    # At t1 the rate drops from CAP to CAP/2: t = t1 + (B - CAP t1) / (CAP / 2) = 2B/CAP - t1.
    t1 = 0.25e-3
    topo = pair(lanes=2)
    (t,), _, injector = run_with(topo, [inj(at=t1, target={"lane": [0, 1]})], [(0, 1)], delay=1.0)
    assert t == pytest.approx(2 * B / CAP - t1, rel=1e-12)
    link = topo.link(chip_node(0), chip_node(1))
    back = topo.link(chip_node(1), chip_node(0))
    assert topo.capacity_Bps[link] == topo.capacity_Bps[back] == CAP / 2
    assert topo.state(link) == "degraded"
    assert injector.records[0]["effect"] == "1 of 2 lanes up"


def test_lane_up_restores_the_rate() -> None:
    # Half speed over [t1, t2]: t = B/CAP + (t2 - t1) / 2.
    t1, t2 = 0.2e-3, 0.4e-3
    topo = pair(lanes=2)
    plan = [inj(at=t1, target={"lane": [0, 1]}), inj(at=t2, target={"lane": [1, 0]}, kind="up")]
    (t,), _, _ = run_with(topo, plan, [(0, 1)], delay=1.0)
    assert t == pytest.approx(B / CAP + (t2 - t1) / 2, rel=1e-12)
    assert topo.lanes_up(topo.link(chip_node(0), chip_node(1))) == 2


@pytest.mark.parametrize("f", [0.5, 0.1])
def test_degrade_scales_the_capacity(f: float) -> None:
    t1 = 0.3e-3
    topo = pair(lanes=1)
    (t,), _, _ = run_with(
        topo, [inj(at=t1, target={"link": [0, 1]}, kind={"degrade": f})], [(0, 1)], delay=1.0
    )
    assert t == pytest.approx(t1 + (B - CAP * t1) / (f * CAP), rel=1e-12)


def test_link_down_stalls_until_detection_then_reroutes() -> None:
    # 0 -> 1 direct; the link dies at t1, routing notices at t1 + d, and the flow
    # finishes its bytes over 0 -> 3 -> 2 -> 1 at the same rate: t = B/CAP + d.
    t1, d = 0.4e-3, 2e-3
    topo = ring(4)
    (t,), net, injector = run_with(topo, [inj(at=t1, target={"link": [0, 1]})], [(0, 1)], delay=d)
    assert t == pytest.approx(B / CAP + d, rel=1e-9)
    assert net.reroutes == 1
    rec = injector.records[0]
    assert rec["applied_s"] == t1
    assert rec["detected_s"] == pytest.approx(t1 + d)
    assert topo.state(topo.link(chip_node(0), chip_node(1))) == "down"
    assert topo.route(0, 1) == tuple(
        topo.link(chip_node(a), chip_node(b)) for a, b in ((0, 3), (3, 2), (2, 1))
    )


def test_a_rerouted_flow_shares_its_detour() -> None:
    # After detection 0 -> 1 detours over 3 -> 2, which a second flow 3 -> 2 uses too:
    # both get CAP/2 from then on. Flow A: CAP t1 bytes before, stalled for d, then
    # the rest at CAP/2 while B runs (B started at t1 + d with B bytes; A left B - CAP t1).
    t1, d = 0.2e-3, 0.5e-3
    topo = ring(4)
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    Injector(
        env, topo, resolve([inj(at=t1, target={"link": [0, 1]})], topo), detect_delay_s=d
    ).start()
    a = net.transfer([(0, 1)], B, 0.0)
    later = env.event()

    def second() -> Any:
        yield env.timeout(t1 + d)
        done = net.transfer([(3, 2)], B, 0.0)
        yield done
        later.succeed(env.now)

    env.process(second())
    ta, tb = finish_times(env, [a, later])
    left_a = B - CAP * t1
    assert ta == pytest.approx(t1 + d + left_a / (CAP / 2), rel=1e-9)
    # B ran at CAP/2 while A was left, then at CAP.
    assert tb == pytest.approx(ta + (B - (ta - t1 - d) * CAP / 2) / CAP, rel=1e-9)


def test_link_up_before_detection_cancels_it() -> None:
    # Dark over [t1, t2]; back up before routing noticed: no reroute, t = B/CAP + (t2 - t1).
    t1, t2, d = 0.2e-3, 0.5e-3, 1e-3
    topo = ring(4)
    plan = [inj(at=t1, target={"link": [0, 1]}), inj(at=t2, target={"link": [0, 1]}, kind="up")]
    (t,), net, injector = run_with(topo, plan, [(0, 1)], delay=d)
    assert t == pytest.approx(B / CAP + (t2 - t1), rel=1e-9)
    assert net.reroutes == 0
    assert injector.records[0]["detected_s"] is None
    assert topo.links_down == 0


def test_degrade_survives_a_lane_change_and_up_clears_it() -> None:
    topo = pair(lanes=2)
    env = simpy.Environment()
    plan = [
        inj(at=0, target={"link": [0, 1]}, kind={"degrade": 0.5}),
        inj(at=1, target={"lane": [0, 1]}),
        inj(at=2, target={"link": [0, 1]}, kind="up"),
    ]
    injector = Injector(env, topo, resolve(plan, topo), detect_delay_s=0.0)
    injector.start()
    link = topo.link(chip_node(0), chip_node(1))
    env.run(until=0.5)
    assert topo.capacity_Bps[link] == CAP / 2
    env.run(until=1.5)
    assert topo.capacity_Bps[link] == CAP / 4
    env.run(until=2.5)
    assert topo.capacity_Bps[link] == CAP


def test_up_clears_a_degrade_on_a_healthy_link() -> None:
    topo = pair(lanes=1)
    env = simpy.Environment()
    plan = [
        inj(at=0, target={"link": [0, 1]}, kind={"degrade": 0.5}),
        inj(at=1, target={"link": [1, 0]}, kind="up"),
    ]
    Injector(env, topo, resolve(plan, topo), detect_delay_s=0.0).start()
    env.run()
    assert (topo.capacity_Bps == topo.nominal_Bps).all()


def test_chip_down_raises_step_failure_at_its_time() -> None:
    topo = ring(4)
    env = simpy.Environment()
    Injector(env, topo, resolve([inj(at=3e-3, target={"chip": 2})], topo), detect_delay_s=0).start()
    with pytest.raises(StepFailure) as info:
        env.run()
    assert info.value.at_s == 3e-3
    assert info.value.cause == "chip2 down"
    assert "failures.inject.0" in str(info.value)


def test_slowdown_integrates_the_pieces() -> None:
    slow = Slowdown([1.0, 3.0], [2.0, 1.0])  # x2 over [1, 3), healthy again after 3
    assert slow(0.0, 0.5) == 0.5
    assert slow(1.0, 0.5) == pytest.approx(1.0)
    # from 0.5: 0.5 s healthy to t=1, then 1 s of work takes 2 s -> ends at 3.
    assert slow(0.5, 1.5) == pytest.approx(2.5)
    # spans all three pieces: 1 s + (2 s of wall for 1 s of work) + 1 s.
    assert slow(0.0, 3.0) == pytest.approx(4.0)
    assert slow(5.0, 1.0) == pytest.approx(1.0)


def test_switch_and_nic_targets_resolve_to_their_links() -> None:
    topo = trn2(2)
    actions = resolve(
        [inj(target={"switch": "efa"}), inj(target={"nic": 1}, kind={"degrade": 0.5})], topo
    )
    efa = np.flatnonzero(topo.kinds == "efa")
    assert sorted(actions[0].target.links.tolist()) == efa.tolist()
    nic1 = actions[1].target.links
    assert nic1.size == 2 * 16  # each chip of instance 1: up and down
    chips = np.where(topo.link_u[nic1] < topo.n_chips, topo.link_u[nic1], topo.link_v[nic1])
    assert set(chips.tolist()) == set(range(16, 32))
    inst = resolve([inj(target={"instance": 1}, kind={"straggle": 2})], topo)[0]
    assert inst.target.chips == tuple(range(16, 32))


@pytest.mark.parametrize(
    ("target", "kind", "path", "words"),
    [
        ({"chip": 16}, "down", "failures.inject.0.target.chip", "no chip 16; chips are 0..15"),
        ({"link": [0, 5]}, "down", "failures.inject.0.target.link", "chip0 and chip5 are not"),
        ({"lane": [0, "chip9"]}, "down", "failures.inject.0.target.lane", "not linked"),
        ({"switch": "spine9"}, "down", "failures.inject.0.target.switch", "no node named"),
        ({"switch": "chip3"}, "down", "failures.inject.0.target.switch", "names a chip"),
        ({"nic": 0}, "down", "failures.inject.0.target.nic", "no EFA links"),
        ({"instance": 1}, "down", "failures.inject.0.target.instance", "no instance 1"),
        ({"lane": [0, 1]}, {"degrade": 0.5}, "failures.inject.0.kind", "lane"),
        ({"link": [0, 1]}, {"straggle": 2}, "failures.inject.0.kind", "link"),
    ],
)
def test_bad_targets_name_the_key(target: dict[str, Any], kind: Any, path: str, words: str) -> None:
    topo = trn2(1)
    with pytest.raises(ScenarioError) as info:
        resolve([inj(target=target, kind=kind)], topo)
    assert info.value.path == path
    assert words in str(info.value)


def test_folding_rule() -> None:
    lane = inj(target={"lane": [0, 1]})
    chip = inj(target={"chip": 0})
    straggle = inj(target={"chip": 0}, kind={"straggle": 2})
    assert breaks_symmetry(lane) and breaks_symmetry(straggle) and not breaks_symmetry(chip)
    assert fold_with([chip], True, "auto") is True
    assert fold_with([chip, lane], True, "auto") is False
    assert fold_with([lane], False, "detailed") is False
    with pytest.raises(ScenarioError) as info:
        fold_with([chip, straggle], True, "folded")
    assert info.value.path == "--fidelity"
    assert "failures.inject.1" in str(info.value)
