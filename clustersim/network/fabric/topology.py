"""The physical network of a cluster: chips, switches and links, and routes over them.

A :class:`Topology` keeps its links in numpy columns, so that building an
UltraCluster of 10^5 chips and 10^6 links costs a few bulk array operations.
Nodes are chips (``("chip", i)`` with the global chip index ``i = instance *
chips_per_instance + local index``; node id ``i``), switches (``("switch",
instance)``, ``("leaf", i)``, ``("spine", tier, i)``, ...) and the non-blocking
scale-out switch ``("efa",)``. Every directed link has a capacity (its total
over ``lanes`` parallel lanes), a latency, a kind and a count of working lanes.
The solver reads the numpy arrays :attr:`Topology.capacity_Bps` (current
capacity: nominal x lanes up / lanes, zero when down) and
:attr:`Topology.latency_s`, indexed by link. :attr:`Topology.graph` is a
``networkx`` view built on first use, for inspection.

Each chip also has a ``local`` self-loop link that carries traffic between ranks
on the same chip: intra-chip DMA, which reads and writes the chip's HBM, so its
capacity is the smaller of the DMA engines' throughput and half the HBM's
sustained bandwidth, and its latency is a DMA transfer's set-up
(:func:`local_path`).

**Domains.** Chips are grouped into scale-up domains of ``domain_instances``
consecutive instances (one instance, or an UltraServer). Inside a domain a
builder's *path function* gives each chip pair its preferred path
(dimension-order on a torus, up-down through a switch tier). Between domains a
:class:`~.scaleout.ScaleOut` fabric routes pairs in bulk (vectorised, and not
cached: an all-to-all over thousands of chips would otherwise fill the cache with
millions of routes). When a link on the preferred path is down, the scale-out fabric first
tries its other equal-cost paths (ECMP), then routing falls back to the
lowest-latency path over the links that are still up (scipy's Dijkstra), and
raises :class:`~clustersim.errors.PartitionError` when there is none, naming the
chips and the down links on their preferred route. A degraded link (some lanes
down) keeps its routes and only loses capacity.

Routes are cached per topology :attr:`~Topology.version`, which every change of
links or lanes increments; listeners (:meth:`Topology.add_listener`, e.g. a
:class:`~clustersim.network.flows.flownetwork.FlowNetwork`) are told of every change.

Builders and scale-out fabrics are registered by name in
:mod:`clustersim.network.fabric.registry`, whose
:func:`~clustersim.network.fabric.registry.build_topology` builds a cluster's topology.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike, NDArray

from clustersim.catalog.schema import ChipSpec
from clustersim.errors import SimulationError
from clustersim.network.fabric.links import Int64s, LinkKind, LinkState, Node
from clustersim.network.fabric.routes import PathFn, Routes
from clustersim.network.fabric.scaleout import ScaleOut

if TYPE_CHECKING:  # scipy and networkx load on first use: a collective needs neither
    import networkx as nx
    import scipy.sparse as sp

    from clustersim.network.fabric.domainpaths import LocalPaths

__all__ = [
    "EFA_NODE",
    "Int64s",
    "LinkKind",
    "LinkState",
    "Node",
    "PathFn",
    "ScaleOut",
    "Topology",
    "chip_node",
    "ecmp_hash",
    "local_path",
]

EFA_NODE: Node = ("efa",)


def chip_node(chip: int) -> Node:
    return ("chip", chip)


def local_path(chip: ChipSpec) -> tuple[float, float]:
    """Capacity (B/s) and latency (s) of the intra-chip path between two ranks of ``chip``.

    A transfer between cores of one chip is a DMA copy from HBM to HBM: every byte is
    read once and written once, so it gets at most half of the HBM's sustained
    bandwidth, and never more than the DMA engines move. Each transfer pays the DMA
    set-up (``chip.dma_setup_s``).
    """
    hbm = chip.hbm_bw_Bps * chip.calibration.hbm_efficiency / 2
    return min(chip.dma_bw_Bps, hbm), chip.dma_setup_s


def ecmp_hash(a: ArrayLike, b: ArrayLike) -> Int64s:
    """A deterministic, well-mixed non-negative hash of integer pairs (splitmix64 finaliser)."""
    x = (np.asarray(a, dtype=np.int64).astype(np.uint64) << np.uint64(32)) ^ np.asarray(
        b, dtype=np.int64
    ).astype(np.uint64)
    with np.errstate(over="ignore"):  # arithmetic modulo 2**64 is the point
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    out: Int64s = (x >> np.uint64(2)).astype(np.int64)
    return out


class Topology(Routes):
    """Chips in scale-up domains, switches and links, with cached routes.

    ``domain_instances`` consecutive instances form one scale-up domain. ``path_fn``
    gives each chip pair of a domain its preferred path; without one, routes are
    lowest-latency paths. Builders add links with :meth:`add_link` or, in bulk,
    :meth:`add_links`, and set :attr:`scaleout` (or let :func:`build_topology` do it).
    """

    def __init__(
        self,
        name: str,
        *,
        chips_per_instance: int,
        instances: int = 1,
        local_bw_Bps: float,
        local_latency_s: float = 0.0,
        path_fn: PathFn | None = None,
        domain_instances: int = 1,
    ) -> None:
        if chips_per_instance < 1 or instances < 1 or domain_instances < 1:
            raise SimulationError(
                f"topology {name!r} needs at least one chip, instance and instance per domain "
                f"(got {chips_per_instance} chips x {instances} instances, "
                f"{domain_instances} per domain)"
            )
        if instances % domain_instances:
            raise SimulationError(
                f"topology {name!r}: {instances} instances do not fill domains of "
                f"{domain_instances}"
            )
        self.chips_per_instance = chips_per_instance
        self.instances = instances
        self.domain_instances = domain_instances
        self.path_fn = path_fn
        self.local_paths: LocalPaths | None = None
        """``path_fn`` as one table, when every domain is the same torus (set by builders)."""
        self.scaleout: ScaleOut | None = None
        self._routes: dict[tuple[int, int], tuple[int, ...]] = {}
        self._pred: dict[int, NDArray[np.int32]] = {}
        self._usable_csr: sp.csr_matrix | None = None
        self._graph: nx.DiGraph | None = None
        n = chips_per_instance * instances
        # chip_node(0), chip_node(1), ...: numbered by the table, not stored (see LinkTable).
        super().__init__(name, chips=n)
        self.chip_domain: Int64s = np.arange(n, dtype=np.int64) // (
            chips_per_instance * domain_instances
        )
        """Scale-up domain of each chip."""
        self.filled_chips = n
        """Chips that hold instances: the first ones; a partly filled last domain's empty
        slots (``cluster.domain_fill: last``) are built after them and carry no ranks."""
        self.chip_coords: Int64s | None = None
        """Torus coordinates of each chip within its domain (``n_chips x rank``), if a torus."""
        self.torus_dims: tuple[int, ...] = ()
        chips = np.arange(n, dtype=np.int64)
        self.local_links: Int64s = self.add_links(
            chips, chips, capacity_Bps=local_bw_Bps, latency_s=local_latency_s, kind="local"
        )
        """Each chip's ``local`` self-loop link: the route of a chip to itself."""

    def set_chip_coords(self, coords: ArrayLike, dims: Sequence[int]) -> None:
        """Record each chip's torus coordinates within its domain, and the torus size."""
        arr = np.asarray(coords, dtype=np.int64)
        if arr.shape != (self.n_chips, len(dims)):
            raise SimulationError(f"topology {self.name!r}: coords must be n_chips x {len(dims)}")
        self.chip_coords = arr
        self.torus_dims = tuple(int(d) for d in dims)
        self._graph = None

    @property
    def n_chips(self) -> int:
        return self.chips_per_instance * self.instances

    @property
    def n_domains(self) -> int:
        return self.instances // self.domain_instances

    @property
    def chips_per_domain(self) -> int:
        return self.chips_per_instance * self.domain_instances

    def local_link(self, chip: int) -> int:
        return int(self.local_links[chip])

    def instance_of(self, chip: int) -> int:
        return chip // self.chips_per_instance

    def domain_of(self, chip: int) -> int:
        return chip // self.chips_per_domain

    def add_nodes(self, nodes: Iterable[Node]) -> Int64s:
        ids = super().add_nodes(nodes)
        self._graph = None
        return ids

    def _changed(self) -> None:
        self._routes.clear()
        self._pred.clear()
        self._usable_csr = None
        if self._graph is not None and self._graph.number_of_edges() != self.n_links:
            self._graph = None
        super()._changed()

    def _state_changed(self, link: int) -> None:
        if self._graph is not None:
            attrs = self._graph.edges[self.endpoints(link)]
            attrs.update(
                lanes_up=self.lanes_up(link),
                state=self.state(link),
                capacity_Bps=float(self.capacity_Bps[link]),
            )

    # -- networkx view --------------------------------------------------------------------------

    @property
    def graph(self) -> nx.DiGraph:
        """A ``networkx`` view: node and edge attributes as documented in the module.

        Chip nodes carry ``instance``, ``domain`` and (on a torus) ``coords``; the graph
        attribute ``torus_dims`` gives the torus size. Built on first use: costly at scale.
        """
        if self._graph is None:
            import networkx as nx

            g = nx.DiGraph()
            if self.torus_dims:
                g.graph["torus_dims"] = self.torus_dims
            for i, node in enumerate(self.nodes()):
                if i < self.n_chips:
                    attrs: dict[str, object] = {
                        "kind": "chip",
                        "instance": self.instance_of(i),
                        "domain": int(self.chip_domain[i]),
                    }
                    if self.chip_coords is not None:
                        attrs["coords"] = tuple(int(x) for x in self.chip_coords[i])
                    g.add_node(node, **attrs)
                else:
                    g.add_node(node, kind=str(node[0]))
            kinds = self.kinds
            for link in range(self.n_links):
                u, v = self.endpoints(link)
                g.add_edge(
                    u,
                    v,
                    link=link,
                    kind=str(kinds[link]),
                    capacity_Bps=float(self.capacity_Bps[link]),
                    latency_s=float(self.latency_s[link]),
                    lanes=self.lanes(link),
                    lanes_up=self.lanes_up(link),
                    state=self.state(link),
                )
            self._graph = g
        return self._graph
