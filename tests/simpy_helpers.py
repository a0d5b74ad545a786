"""Helpers shared by tests that drive a SimPy environment directly."""

from __future__ import annotations

from collections.abc import Callable

import simpy


def finish_times(env: simpy.Environment, events: list[simpy.Event]) -> list[float]:
    """Run ``env`` to the end; the simulated time at which each event fired (nan if never)."""
    times = [float("nan")] * len(events)

    def stamp(i: int) -> Callable[[simpy.Event], None]:
        return lambda _ev: times.__setitem__(i, float(env.now))

    for i, ev in enumerate(events):
        ev.callbacks.append(stamp(i))
    env.run()
    return times
