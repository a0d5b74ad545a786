"""Simulation: plan a scenario (layout, programs, memory), run it, summarise it."""

from clustersim.sim.guard import Estimate, Limits, estimate
from clustersim.sim.result import Plan, Result
from clustersim.sim.run import (
    FOLD_ABOVE_RANKS,
    Fidelity,
    degraded_step,
    estimate_run,
    plan,
    simulate,
)

__all__ = [
    "FOLD_ABOVE_RANKS",
    "Estimate",
    "Fidelity",
    "Limits",
    "Plan",
    "Result",
    "degraded_step",
    "estimate",
    "estimate_run",
    "plan",
    "simulate",
]
