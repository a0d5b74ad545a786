"""The ``summary.json`` keys every run has, finished or failed: what was run, and
how the simulation went (events, wall time, fidelity, version)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clustersim._version import __version__
from clustersim.workload import microbatches

if TYPE_CHECKING:
    from clustersim.network import Network
    from clustersim.scenario.models import ParallelismCfg
    from clustersim.sim.engine import StepSim
    from clustersim.sim.result import Plan

__all__ = ["run_identity", "simulation_keys"]


def run_identity(pl: Plan) -> dict[str, Any]:
    """Scenario, seed, cluster, model and layout: the summary's leading keys."""
    res, sc, layout = pl.resolved, pl.resolved.scenario, pl.layout
    return {
        "scenario": sc.name,
        "seed": sc.seed,
        "instance": res.instance.name,
        "instances": sc.cluster.count,
        "chip": res.chip.name,
        "model": res.model.name,
        "software": res.software.as_dict(),
        "chips": res.chips,
        "ranks": res.ranks,
        "layout": {
            "tp": layout.tp,
            "pp": layout.pp,
            "dp": layout.dp,
            "cp": layout.cp,
            "microbatches": microbatches(sc.parallelism, sc.training, layout),
            "schedule": sc.parallelism.schedule,
            "virtual_stages": layout.vp,
            "recompute": _recompute(sc.parallelism),
            "zero": sc.parallelism.zero,
            "lnc": res.lnc,
        },
    }


def simulation_keys(sim: StepSim, network: Network, wall_s: float) -> dict[str, Any]:
    """Events, wall time, fidelity, simulated ranks and version."""
    events = sim.ops + network.transfers_done
    return {
        "events": events,
        "events_per_s": events / wall_s if wall_s > 0 else 0.0,
        "wall_s": wall_s,
        "fidelity": "folded" if sim.folded else "detailed",
        "chip_model": sim.chip_model,
        "simulated_ranks": len(sim.ranks),
        "clustersim_version": __version__,
    }


def _recompute(par: ParallelismCfg) -> str:
    """``par.recompute``, with the modules selective recompute reruns when they are listed,
    or ``(op)`` under torchtitan's per-op policy."""
    mods = par.recompute_modules
    if par.recompute == "selective" and par.recompute_policy == "op":
        return "selective (op)"
    if par.recompute != "selective" or mods is None:
        return par.recompute
    return f"selective ({', '.join(dict.fromkeys(mods))})"
