"""The engine's wait for a rank's collectives against SimPy's ``AllOf``: the same order."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pytest
import simpy

from clustersim.sim.engine import _all_of

Wait = Callable[[simpy.Environment, list[simpy.Event]], simpy.Event]


def _schedule(wait: Wait) -> tuple[list[tuple[float, str]], int]:
    """Processes that wait on events already processed, triggered later, triggered at the
    instant they wait and never; what resumed when, in order, and the events scheduled."""
    env = simpy.Environment()
    log: list[tuple[float, str]] = []
    ends = [env.timeout(t) for t in (1.0, 2.0, 2.0, 3.0)]

    def waiter(name: str, start: float, events: list[simpy.Event]) -> Generator[Any, Any, None]:
        yield env.timeout(start)
        yield wait(env, events)
        log.append((env.now, name))
        yield env.timeout(0.5)
        log.append((env.now, name + " after"))

    def ticker() -> Generator[Any, Any, None]:
        for _ in range(8):
            yield env.timeout(0.5)
            log.append((env.now, "tick"))

    env.process(ticker())
    env.process(waiter("done before", 2.5, ends[:2]))
    env.process(waiter("one later", 0.0, ends[3:]))
    env.process(waiter("at the instant", 2.0, ends[1:3]))
    env.process(waiter("mixed", 1.5, ends))
    env.process(waiter("single done", 2.0, ends[:1]))
    env.process(waiter("empty", 1.0, []))
    env.run()
    return log, int(next(env._eid))


def test_all_of_keeps_simpys_order() -> None:
    log, scheduled = _schedule(_all_of)
    assert (log, scheduled) == _schedule(simpy.AllOf)
    assert (3.0, "one later") in log


def _failing(wait: Wait) -> tuple[float, str]:
    env = simpy.Environment()
    ok, bad = env.timeout(1.0), env.event()
    seen: list[tuple[float, str]] = []

    def fail() -> Generator[Any, Any, None]:
        yield env.timeout(2.0)
        bad.fail(RuntimeError("lost a link"))

    def waiter() -> Generator[Any, Any, None]:
        try:
            yield wait(env, [ok, bad])
        except RuntimeError as exc:
            seen.append((env.now, str(exc)))

    env.process(fail())
    env.process(waiter())
    env.run()
    return seen[0]


def test_all_of_fails_as_simpy_does() -> None:
    assert _failing(_all_of) == _failing(simpy.AllOf) == (2.0, "lost a link")


@pytest.mark.parametrize("wait", [_all_of, simpy.AllOf])
def test_all_of_waits_for_every_event(wait: Wait) -> None:
    env = simpy.Environment()
    events = [env.timeout(t) for t in (3.0, 1.0, 2.0)]
    done = wait(env, events)
    env.run(until=done)
    assert env.now == 3.0
