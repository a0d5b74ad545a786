"""clustersim: a discrete-event simulator of AI-training clusters.

Public API::

    from clustersim import load_scenario, simulate
    result = simulate(load_scenario("scenarios/trn2-llama3-8b.yaml"))
    result.summary["step_time_s"]

The simulator is imported on first use, so ``import clustersim`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clustersim._version import __version__
from clustersim.errors import ClusterSimError, PartitionError, ScenarioError

if TYPE_CHECKING:
    from clustersim.scenario import Resolved, load_scenario
    from clustersim.sim import Result, plan, simulate

__all__ = [
    "ClusterSimError",
    "PartitionError",
    "Resolved",
    "Result",
    "ScenarioError",
    "__version__",
    "load_scenario",
    "plan",
    "simulate",
]

_LAZY = {
    "Resolved": "clustersim.scenario",
    "load_scenario": "clustersim.scenario",
    "Result": "clustersim.sim",
    "plan": "clustersim.sim",
    "simulate": "clustersim.sim",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'clustersim' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
