"""Pipeline schedules: the order in which one stage runs its forwards and backwards.

A schedule is a plain function ``(stage, stages, microbatches) -> order`` where
``order`` lists ``("F", microbatch)`` and ``("B", microbatch)`` items. It is
registered under the name a scenario uses (``parallelism.schedule``) with
``@register_schedule("name")``. Any order is deadlock-free as long as every
stage runs each microbatch's forwards in the same order, and its backwards in
the same order, as its neighbours: sends never block, and a stage only waits for
a message its neighbour sends earlier in that neighbour's own order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from clustersim.errors import ScenarioError

__all__ = [
    "Order",
    "Schedule",
    "get_schedule",
    "gpipe",
    "one_f_one_b",
    "peak_in_flight",
    "register_schedule",
    "schedule_names",
]

Step = tuple[Literal["F", "B"], int]
Order = list[Step]
Schedule = Callable[[int, int, int], Order]

_SCHEDULES: dict[str, Schedule] = {}


def register_schedule(name: str) -> Callable[[Schedule], Schedule]:
    """Register a schedule function under its YAML name."""

    def deco(fn: Schedule) -> Schedule:
        if name in _SCHEDULES:
            raise ValueError(f"pipeline schedule {name!r} is already registered")
        _SCHEDULES[name] = fn
        return fn

    return deco


def schedule_names() -> list[str]:
    return sorted(_SCHEDULES)


def get_schedule(name: str) -> Schedule:
    """The schedule registered as ``name``; an unknown name lists the valid ones."""
    try:
        return _SCHEDULES[name]
    except KeyError:
        raise ScenarioError(
            "parallelism.schedule",
            name,
            f"unknown pipeline schedule; valid: {', '.join(schedule_names())}",
        ) from None


def peak_in_flight(order: Sequence[Step]) -> int:
    """Most microbatches whose forward has run but whose backward has not.

    This is how many microbatches' activations a stage holds at its peak.
    """
    live = peak = 0
    for kind, _mb in order:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


@register_schedule("gpipe")
def gpipe(stage: int, stages: int, microbatches: int) -> Order:
    """GPipe (Huang et al. 2019): every forward, then every backward."""
    del stage, stages  # the same order on every stage
    order: Order = [("F", mb) for mb in range(microbatches)]
    order += [("B", mb) for mb in range(microbatches)]
    return order


@register_schedule("1f1b")
def one_f_one_b(stage: int, stages: int, microbatches: int) -> Order:
    """1F1B (PipeDream-Flush, Narayanan et al. 2021).

    Warm up with ``stages - stage - 1`` forwards (the microbatches needed to fill
    the pipeline below this stage), then alternate one forward and one backward,
    then drain the remaining backwards. A stage holds at most
    ``min(stages - stage, microbatches)`` microbatches' activations.
    """
    warmup = min(stages - stage - 1, microbatches)
    order: Order = [("F", mb) for mb in range(warmup)]
    for i in range(microbatches - warmup):
        order.append(("F", warmup + i))
        order.append(("B", i))
    order += [("B", mb) for mb in range(microbatches - warmup, microbatches)]
    return order
