"""Simulation: plan a scenario (layout, programs, memory), run it, summarise it."""

from clustersim.sim.run import Plan, Result, plan, simulate

__all__ = ["Plan", "Result", "plan", "simulate"]
