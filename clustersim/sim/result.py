"""What a simulation decides and what it produces: ``Plan`` (layout, programs, memory
per chip, before simulating) and ``Result`` (the summary, the simulated ranks and the
network, after).

Both live here, apart from :mod:`clustersim.sim.run` that builds them, so the modules
that read them (the injected-failure summary, the summary keys, the trace) import
this leaf rather than the runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from clustersim.hardware.chip import ChipModel
from clustersim.scenario import Resolved
from clustersim.workload import Layout, MemoryBreakdown, MemoryCheck
from clustersim.workload.program import Program

if TYPE_CHECKING:
    import pandas as pd

    from clustersim.failures.reliability import Outcome
    from clustersim.network import Network
    from clustersim.sim.engine import CompiledProgram, StepSim

__all__ = ["GIB", "Plan", "Result"]

GIB = 2.0**30


@dataclass
class Plan:
    """Everything decided before simulating: layout, programs, memory per chip."""

    resolved: Resolved
    layout: Layout
    chip: ChipModel
    programs: list[Program]
    memory: list[MemoryBreakdown]  # per stage, bytes per rank
    memory_check: MemoryCheck | None = None
    """The fullest chip's counted state, runtime reserve and fragmentation against HBM."""

    @property
    def peak_memory(self) -> MemoryBreakdown:
        return max(self.memory, key=lambda m: m.total)

    def memory_gib_per_chip(self) -> dict[str, float]:
        mem, rpc = self.peak_memory, self.resolved.ranks_per_chip
        return {
            "weights": mem.weights * rpc / GIB,
            "grads": mem.grads * rpc / GIB,
            "optimizer": mem.optimizer * rpc / GIB,
            "activations": mem.activations * rpc / GIB,
            "total": mem.total * rpc / GIB,
            "capacity": self.resolved.chip.hbm_bytes / GIB,
        }

    def memory_check_summary(self) -> dict[str, object] | None:
        """``summary.json``'s ``memory_check``: the check's lines in GiB per chip and its
        warning (null when the run fits with the allocator's fragmentation)."""
        mc = self.memory_check
        if mc is None:
            return None
        return {**mc.gib(), "warning": mc.warning}


@dataclass
class Result:
    """A simulated scenario: its plan, ``summary.json``, the simulated ranks and network."""

    plan: Plan
    summary: dict[str, Any]
    sim: StepSim
    compiled: list[CompiledProgram]
    reliability: list[Outcome] = field(default_factory=list)
    """Replications of the long-horizon model, when ``failures`` configures it."""

    def trace_frame(self) -> pd.DataFrame:
        from clustersim.sim.tracing import trace_frame

        failed = self.summary.get("step_failed")
        return trace_frame(
            self.sim,
            self.compiled,
            self.plan.layout,
            lnc=self.plan.chip.lnc,
            ranks_per_chip=self.plan.resolved.ranks_per_chip,
            steps=self.plan.resolved.scenario.training.steps,
            failed_at_s=failed["at_s"] if failed else None,
        )

    def engine_frame(self) -> pd.DataFrame | None:
        """With the engine model: each engine's chunks of tiles on the first rank of each
        stage in the first step (columns in :data:`clustersim.trace.engines.ENGINE_COLUMNS`)."""
        from clustersim.sim.tracing import engine_frame

        return engine_frame(
            self.sim,
            self.compiled,
            self.plan.layout,
            lnc=self.plan.chip.lnc,
            ranks_per_chip=self.plan.resolved.ranks_per_chip,
        )

    @property
    def network(self) -> Network:
        """The simulated network: its topology and per-link statistics over the run."""
        return self.sim.network

    def link_table(self) -> pd.DataFrame:
        """One row per link: utilisation over the run and where the link sits in the
        topology (columns in :data:`clustersim.trace.links.LINK_COLUMNS`)."""
        from clustersim.trace.links import link_frame

        net = self.sim.network
        return link_frame(net.topology, net.flows.link_utilisation())
