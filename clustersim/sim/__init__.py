"""Simulation: plan a scenario (layout, programs, memory), run it, summarise it."""

from clustersim.sim.guard import Estimate, Limits, estimate
from clustersim.sim.run import Plan, Result, plan, simulate

__all__ = ["Estimate", "Limits", "Plan", "Result", "estimate", "plan", "simulate"]
