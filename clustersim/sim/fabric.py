"""The fabric of a scenario: built from the catalog, or read from ``cluster.fabric_file``.

A fabric file (GraphML, GML or node-link JSON; :mod:`clustersim.network.graphio`)
replaces the built fabric: it is read within bounds, checked against the
scenario's instances (:mod:`clustersim.network.graphcheck`) and compiled into a
:class:`~clustersim.network.custom.GraphTopology`. The checked graph is kept per
file (path, size and modification time) and cluster shape, so planning, checking
injections and simulating read it once.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from clustersim.errors import ScenarioError
from clustersim.network.custom import GraphTopology
from clustersim.network.graphcheck import FabricSpec, check_fabric
from clustersim.network.graphio import read_fabric
from clustersim.network.registry import build_topology
from clustersim.network.topology import Topology
from clustersim.scenario import Resolved

__all__ = ["FABRIC_KEY", "fabric_spec", "scenario_topology"]

FABRIC_KEY = "cluster.fabric_file"


@lru_cache(maxsize=8)
def _checked(path: str, stamp: tuple[int, int], cpi: int, instances: int) -> FabricSpec:
    del stamp  # part of the key only: a rewritten file is read again
    g = read_fabric(Path(path), FABRIC_KEY)
    return check_fabric(g, chips_per_instance=cpi, instances=instances, where=FABRIC_KEY)


def fabric_spec(res: Resolved) -> FabricSpec | None:
    """The checked graph of ``cluster.fabric_file``; None when the scenario has none."""
    name = res.scenario.cluster.fabric_file
    if name is None:
        return None
    path = Path(name)
    try:
        st = path.stat()
    except OSError:
        raise ScenarioError(FABRIC_KEY, name, "no such file") from None
    return _checked(
        str(path.resolve()),
        (st.st_size, st.st_mtime_ns),
        res.instance.chips,
        res.scenario.cluster.count,
    )


def scenario_topology(res: Resolved) -> Topology:
    """The topology a run of ``res`` simulates: the file's graph, or the built fabric."""
    count = res.scenario.cluster.count
    spec = fabric_spec(res)
    if spec is None:
        return build_topology(res.instance, res.chip, count)
    topo = GraphTopology(
        spec,
        chips_per_instance=res.instance.chips,
        instances=count,
        local_bw_Bps=res.chip.dma_bw_Bps,
    )
    try:  # the builder's declared symmetry holds if the graph is its fabric
        built = build_topology(res.instance, res.chip, count)
    except ScenarioError:
        return topo  # the catalog's builder cannot build this cluster: nothing to compare
    topo.prove_symmetry(built)
    return topo
