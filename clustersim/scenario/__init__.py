"""Scenario files: pydantic models, YAML loading, catalog resolution, overrides."""

from clustersim.scenario.load import Resolved, apply_set, load_scenario, parse_yaml, resolve
from clustersim.scenario.models import (
    ClusterCfg,
    CostCfg,
    OutputCfg,
    ParallelismCfg,
    Scenario,
    TrainingCfg,
)

__all__ = [
    "ClusterCfg",
    "CostCfg",
    "OutputCfg",
    "ParallelismCfg",
    "Resolved",
    "Scenario",
    "TrainingCfg",
    "apply_set",
    "load_scenario",
    "parse_yaml",
    "resolve",
]
