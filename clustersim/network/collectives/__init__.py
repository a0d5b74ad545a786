"""The collectives layer: collective algorithms, their registry and the ``auto`` choice.

What an algorithm may know of where its group's ranks sit (:mod:`.groups`); the
registry, its contract and the ``auto`` choice (:mod:`.registry`); the shipped
algorithms (:mod:`.algorithms`), which importing the package registers. Over
:mod:`~clustersim.network.fabric`.
"""

from __future__ import annotations

from clustersim.network.collectives import algorithms  # registers the shipped algorithms
from clustersim.network.collectives.algorithms.hierarchical import parallel_steps, phase_algorithm
from clustersim.network.collectives.algorithms.switched import tree_sends
from clustersim.network.collectives.groups import GroupInfo, group_info, torus_grid
from clustersim.network.collectives.registry import (
    HALVING_DOUBLING_MAX_BYTES,
    MESH_MAX_BYTES,
    MESH_MAX_FLOWS,
    OPS,
    Algorithm,
    Step,
    algorithm,
    algorithm_names,
    busbw_factor,
    choose,
    collective_step_arrays,
    collective_steps,
    register_algorithm,
    resolve_algorithm,
)

__all__ = [
    "HALVING_DOUBLING_MAX_BYTES",
    "MESH_MAX_BYTES",
    "MESH_MAX_FLOWS",
    "OPS",
    "Algorithm",
    "GroupInfo",
    "Step",
    "algorithm",
    "algorithm_names",
    "algorithms",
    "busbw_factor",
    "choose",
    "collective_step_arrays",
    "collective_steps",
    "group_info",
    "parallel_steps",
    "phase_algorithm",
    "register_algorithm",
    "resolve_algorithm",
    "torus_grid",
    "tree_sends",
]
