"""The fabric layer: the physical network of a cluster, and the routes over it.

Nodes and directed links in numpy columns (:mod:`.links`); the :class:`Topology` of
chips in scale-up domains (:mod:`.topology`) with its cached routes (:mod:`.routes`;
paths inside domains that are all the same torus, in bulk: :mod:`.domainpaths`); what
a scale-out fabric offers a topology (:mod:`.scaleout`); the scale-up builders
(:mod:`.builders`) and scale-out fabrics (:mod:`.fabrics`), registered by name
(:mod:`.registry`). Importing the package registers the shipped ones.

The lowest layer of :mod:`clustersim.network`: it imports none of the others.
"""

from __future__ import annotations

from clustersim.network.fabric.builders import (
    NEURONSWITCH_SPINES,
    add_domain_torus,
    add_efa,
    add_torus_links,
    build_neuronswitch,
    build_nvl72,
    build_switch,
    build_torus2d,
    build_torus3d,
    snake_coords,
    torus_domain_coords,
    torus_path,
)
from clustersim.network.fabric.domainpaths import LocalPaths, distinct_pairs
from clustersim.network.fabric.fabrics import (
    SWITCH_HOP_LATENCY_S,
    TreeFabric,
    attach_fat_tree,
    attach_nonblocking,
    attach_rail,
    leaf_ports,
)
from clustersim.network.fabric.links import (
    KINDS,
    Int64s,
    LinkKind,
    LinkState,
    LinkTable,
    Node,
    node_name,
)
from clustersim.network.fabric.registry import (
    Builder,
    FabricBuilder,
    build_topology,
    check_fabrics,
    fabric_names,
    register_fabric,
    register_topology,
    topology_names,
)
from clustersim.network.fabric.routes import PathFn, Routes, crossing_pairs, row_sums
from clustersim.network.fabric.scaleout import ScaleOut
from clustersim.network.fabric.topology import EFA_NODE, Topology, chip_node, ecmp_hash, local_path

__all__ = [
    "EFA_NODE",
    "KINDS",
    "NEURONSWITCH_SPINES",
    "SWITCH_HOP_LATENCY_S",
    "Builder",
    "FabricBuilder",
    "Int64s",
    "LinkKind",
    "LinkState",
    "LinkTable",
    "LocalPaths",
    "Node",
    "PathFn",
    "Routes",
    "ScaleOut",
    "Topology",
    "TreeFabric",
    "add_domain_torus",
    "add_efa",
    "add_torus_links",
    "attach_fat_tree",
    "attach_nonblocking",
    "attach_rail",
    "build_neuronswitch",
    "build_nvl72",
    "build_switch",
    "build_topology",
    "build_torus2d",
    "build_torus3d",
    "check_fabrics",
    "chip_node",
    "crossing_pairs",
    "distinct_pairs",
    "ecmp_hash",
    "fabric_names",
    "leaf_ports",
    "local_path",
    "node_name",
    "register_fabric",
    "register_topology",
    "row_sums",
    "snake_coords",
    "topology_names",
    "torus_domain_coords",
    "torus_path",
]
