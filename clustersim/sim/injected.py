"""Failure injection in a run: building the injector, and the summary of a failed step.

The injection engine is :mod:`clustersim.failures.injection`; this module wires it
into :func:`~clustersim.sim.simulate`. A run with ``failures.inject`` gets
``injections`` in ``summary.json`` (one record per injection: when it applied, the
target's resolved name, what it did) and ``injections.parquet`` beside the trace.

A chip or instance going down fails the step. The run still ends normally, with a
summary that says so: ``step_failed: {at_s, step, cause, injection}``, the steps
that completed before (``steps_completed``, ``step_times_s``), and ``null`` for the
figures that need a finished step (``step_time_s``, ``tokens_per_s``,
``sequences_per_s``, ``mfu``, ``hfu``, ``breakdown_s``, ``uncertainty``, ``cost``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import simpy

from clustersim.failures.injection import Injector, StepFailure, resolve
from clustersim.network import Network
from clustersim.network.fabric import Topology
from clustersim.scenario import Resolved
from clustersim.scenario.failures import FailuresCfg
from clustersim.sim.fabric import scenario_topology
from clustersim.sim.summary_keys import run_identity, simulation_keys
from clustersim.workload import model_flops_per_step

if TYPE_CHECKING:
    import pandas as pd

    from clustersim.sim.engine import StepSim
    from clustersim.sim.result import Plan

__all__ = [
    "INJECTION_COLUMNS",
    "build_injector",
    "check_injections",
    "failed_step_keys",
    "failed_summary",
    "injection_frame",
]

INJECTION_COLUMNS = (
    "index", "at_s", "target", "name", "kind", "factor", "applied_s", "detected_s", "effect",
)  # fmt: skip


def build_injector(env: simpy.Environment, topology: Topology, cfg: FailuresCfg) -> Injector | None:
    """An :class:`Injector` for ``cfg.inject`` on ``topology``, started; None without injections.

    Targets are checked here: a bad one is a ScenarioError naming ``failures.inject.N``.
    """
    if not cfg.inject:
        return None
    actions = resolve(cfg.inject, topology)
    injector = Injector(env, topology, actions, detect_delay_s=cfg.link_detect_delay)
    injector.start()
    return injector


def check_injections(res: Resolved) -> None:
    """Check ``failures.inject`` against the scenario's topology (for ``clustersim check``)."""
    sc = res.scenario
    resolve(sc.failures.inject, scenario_topology(res))


def failed_step_keys(
    failure: StepFailure, steps_done: int, step_times_s: Sequence[float]
) -> dict[str, Any]:
    """The keys a summary gives a step that failed: where and why, and the steps before."""
    return {
        "step_failed": {
            "at_s": failure.at_s,
            "step": steps_done,
            "cause": failure.cause,
            "injection": failure.index,
        },
        "steps_completed": steps_done,
        "step_times_s": [float(t) for t in step_times_s],
        "step_time_s": None,
    }


def failed_summary(
    pl: Plan,
    sim: StepSim,
    network: Network,
    injector: Injector | None,
    *,
    failure: StepFailure,
    wall_s: float,
) -> dict[str, Any]:
    """The summary of a run whose step failed: what is known without a finished step."""
    res, sc = pl.resolved, pl.resolved.scenario
    return {
        **run_identity(pl),
        **failed_step_keys(failure, len(sim.step_ends), sim.step_times_s),
        "tokens_per_step": sc.training.global_batch_size * sc.training.seq_len,
        "tokens_per_s": None,
        "sequences_per_s": None,
        "model_flops_per_step": model_flops_per_step(res.model, sc.training),
        "mfu": None,
        "hfu": None,
        "breakdown_s": None,
        "uncertainty": None,
        "memory_gib_per_chip": pl.memory_gib_per_chip(),
        "memory_check": pl.memory_check_summary(),
        "cost": None,
        **simulation_keys(sim, network, wall_s),
        "injections": injector.records if injector is not None else [],
    }


def injection_frame(summary: dict[str, Any]) -> pd.DataFrame | None:
    """``summary["injections"]`` as a table (``INJECTION_COLUMNS``); None when there are none."""
    records = summary.get("injections")
    if not records:
        return None
    import pandas as pd

    frame = pd.DataFrame.from_records(records, columns=list(INJECTION_COLUMNS))
    for col in ("at_s", "factor", "applied_s", "detected_s"):
        frame[col] = frame[col].astype("float64")
    return frame
