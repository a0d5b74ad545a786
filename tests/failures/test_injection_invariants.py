"""Invariants under random injection schedules on a small torus (Hypothesis).

Whatever fails and when: no link carries more than its capacity at any solve,
completed transfers deliver exactly their bytes, simulated time never goes back,
and a cut fabric ends the run with a PartitionError naming the pair, never a hang.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from clustersim import catalog
from clustersim.errors import PartitionError
from clustersim.failures.injection import Injector, resolve
from clustersim.network.fabric import Topology, build_topology
from clustersim.network.flows import FlowNetwork
from clustersim.scenario.failures import Injection

CHIPS = 16
NBYTES = 4e6  # about 40 us per flow on a Trn2 NeuronLink link


def torus(lanes: int) -> Topology:
    """One trn2.48xlarge: a 4x4 torus of NeuronLink links with ``lanes`` lanes."""
    inst = catalog.instance("trn2.48xlarge", {"fabric": {"lanes": lanes}})
    return build_topology(inst, catalog.chip("trn2"), 1)


def cables(topo: Topology) -> list[tuple[int, int]]:
    u, v = topo.link_u, topo.link_v
    kinds = topo.kinds
    return sorted(
        {
            (int(a), int(b))
            for a, b, k in zip(u, v, kinds, strict=True)
            if k == "neuronlink" and a < b
        }
    )


_CABLES = cables(torus(1))

injection = st.builds(
    lambda at, cable, kind, target: Injection.model_validate(
        {"at": at * 1e-6, "target": {target: list(_CABLES[cable])}, "kind": kind}
    ),
    at=st.integers(0, 300),
    cable=st.integers(0, len(_CABLES) - 1),
    kind=st.sampled_from(["down", "up", {"degrade": 0.5}, {"degrade": 0.25}]),
    target=st.sampled_from(["lane", "link"]),
).filter(lambda inj: not (inj.target.kind == "lane" and not isinstance(inj.kind, str)))

transfer = st.tuples(
    st.integers(0, 200),  # start, us
    st.lists(
        st.tuples(st.integers(0, CHIPS - 1), st.integers(0, CHIPS - 1)).filter(
            lambda p: p[0] != p[1]
        ),
        min_size=1,
        max_size=4,
    ),
    st.floats(0.1, 2.0),  # bytes, in units of NBYTES
)


class Watch:
    """Checks the invariants at every solve of a FlowNetwork."""

    def __init__(self, net: FlowNetwork) -> None:
        self.net = net
        self.times: list[float] = []
        solve = net._on_solve

        def checked(ev: Any) -> None:
            solve(ev)
            topo = net.topology
            load, cap = net.load_Bps, topo.capacity_Bps
            over = load > cap * (1 + 1e-9) + 1e-6
            assert not over.any(), [topo.link_name(int(i)) for i in np.flatnonzero(over)]
            now = float(net.env.now)
            assert not self.times or now >= self.times[-1]
            self.times.append(now)

        net._on_solve = checked  # type: ignore[method-assign]


@settings(max_examples=60, deadline=None)
@given(
    lanes=st.sampled_from([1, 2]),
    injections=st.lists(injection, min_size=1, max_size=6),
    transfers=st.lists(transfer, min_size=1, max_size=8),
    delay_us=st.sampled_from([0, 5, 50]),
)
def test_invariants_under_random_injections(
    lanes: int, injections: list[Injection], transfers: list[Any], delay_us: int
) -> None:
    topo = torus(lanes)
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    watch = Watch(net)
    Injector(env, topo, resolve(injections, topo), detect_delay_s=delay_us * 1e-6).start()
    done: list[tuple[simpy.Event, float]] = []
    partitioned: list[PartitionError] = []

    def start(at_us: int, pairs: list[tuple[int, int]], size: float) -> Any:
        yield env.timeout(at_us * 1e-6)
        try:
            ev = net.transfer(pairs, size * NBYTES, 1e-6)
        except PartitionError as exc:  # no route at the start
            partitioned.append(exc)
            return
        done.append((ev, size * NBYTES * len(pairs)))

    for at_us, pairs, size in transfers:
        env.process(start(at_us, pairs, size))
    try:
        env.run(until=1.0)  # a full second: far beyond any transfer here
    except PartitionError as exc:  # a flow in flight lost its last route
        partitioned.append(exc)
    if partitioned:
        assert all("cannot reach chip" in str(e) for e in partitioned)
        return
    # Nothing hangs: every transfer finished, long before the horizon.
    assert all(ev.triggered for ev, _ in done)
    assert max(watch.times, default=0.0) < 0.1
    # Bytes are conserved: flows delivered what was asked, no more, no less.
    asked = sum(b for _, b in done)
    assert net.bytes_moved == pytest.approx(asked, rel=1e-6)
    assert net.active == 0


def test_a_cut_is_reported_not_hung() -> None:
    # Every link of chip 0 fails while 0 -> 5 is in flight: at detection the flow
    # has no route left, and the run ends with the cut pair named.
    topo = torus(1)
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    cut = [
        Injection.model_validate({"at": 10e-6, "target": {"link": list(c)}})
        for c in _CABLES
        if 0 in c
    ]
    assert len(cut) == 4
    Injector(env, topo, resolve(cut, topo), detect_delay_s=5e-6).start()
    net.transfer([(0, 5)], NBYTES, 1e-6)
    with pytest.raises(PartitionError) as info:
        env.run(until=1.0)
    assert "chip 0 cannot reach chip 5" in str(info.value)
    assert env.now == pytest.approx(15e-6)
