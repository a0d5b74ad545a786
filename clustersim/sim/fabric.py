"""The fabric of a scenario: built from the catalog, or read from ``cluster.fabric_file``.

A fabric file (GraphML, GML or node-link JSON; :mod:`clustersim.network.graphs.graphio`)
replaces the built fabric: it is read within bounds, checked against the
scenario's instances (:mod:`clustersim.network.graphs.graphcheck`) and compiled into a
:class:`~clustersim.network.graphs.custom.GraphTopology`
(:func:`~clustersim.network.graphs.custom.load_graph`, which reads each file once).
"""

from __future__ import annotations

from clustersim.errors import ScenarioError
from clustersim.network.fabric import Topology, build_topology, local_path
from clustersim.network.graphs import GraphTopology, load_graph
from clustersim.scenario import Resolved

__all__ = ["FABRIC_KEY", "fabric_graph_topology", "scenario_topology"]

FABRIC_KEY = "cluster.fabric_file"


def fabric_graph_topology(res: Resolved) -> GraphTopology | None:
    """The compiled graph of ``cluster.fabric_file``; None when the scenario has none."""
    name = res.scenario.cluster.fabric_file
    if name is None:
        return None
    local_Bps, local_s = local_path(res.chip)
    return load_graph(
        name,
        chips_per_instance=res.instance.chips,
        instances=res.scenario.cluster.count,
        local_bw_Bps=local_Bps,
        local_latency_s=local_s,
        where=FABRIC_KEY,
    )


def scenario_topology(res: Resolved) -> Topology:
    """The topology a run of ``res`` simulates: the file's graph, or the built fabric."""
    count = res.scenario.cluster.count
    topo = fabric_graph_topology(res)
    if topo is None:
        return build_topology(res.instance, res.chip, count)
    try:  # the builder's declared symmetry holds if the graph is its fabric
        built = build_topology(res.instance, res.chip, count)
    except ScenarioError:
        return topo  # the catalog's builder cannot build this cluster: nothing to compare
    topo.prove_symmetry(built)
    return topo
