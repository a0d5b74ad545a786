"""The fabric of a scenario: built from the catalog, or read from ``cluster.fabric_file``."""

from __future__ import annotations

from clustersim.network.registry import build_topology
from clustersim.network.topology import Topology
from clustersim.scenario import Resolved

__all__ = ["scenario_topology"]


def scenario_topology(res: Resolved) -> Topology:
    """The topology a run of ``res`` simulates."""
    return build_topology(res.instance, res.chip, res.scenario.cluster.count)
