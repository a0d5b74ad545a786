"""Topology builders, registered by the name used in ``instance.fabric.topology``.

- ``torus2d``: a 2D torus of NeuronLink per instance (Trn1, Trn2), chips placed
  along a snake so that chip order is a Hamiltonian cycle; dimension-order routes.
- ``switch``: one non-blocking switch per instance (NVSwitch; a Trn3 server).

Every builder joins its instances by EFA (:func:`add_efa`). A new fabric (a
3D-torus UltraServer, a Trn3 NeuronSwitch tree, a Clos or rail-optimised
scale-out network) is one more builder composed from the pieces here:
:func:`add_torus_links` and :func:`torus_path` work in any number of
dimensions, and :func:`hierarchical_path` combines an intra-instance path with
the scale-out one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from clustersim.catalog.schema import ChipSpec, InstanceSpec
from clustersim.errors import ScenarioError
from clustersim.network.topology import (
    EFA_NODE,
    Node,
    PathFn,
    Topology,
    chip_node,
    register_topology,
)

__all__ = [
    "add_efa",
    "add_torus_links",
    "build_switch",
    "build_torus2d",
    "hierarchical_path",
    "snake_coords",
    "torus_path",
]


def snake_coords(dims: tuple[int, int]) -> list[tuple[int, int]]:
    """Torus coordinates ``(x, y)`` of local chips 0..X*Y-1 along a boustrophedon.

    Row ``y`` is walked left to right when even and right to left when odd, so
    consecutive chips are neighbours, and with an even number of rows the last
    chip, at ``(0, Y-1)``, neighbours chip 0 through the y wrap-around: the chip
    order is a Hamiltonian cycle of the torus, and a ring over it is contention free.
    """
    nx_, ny = dims
    return [(k if y % 2 == 0 else nx_ - 1 - k, y) for y in range(ny) for k in range(nx_)]


def add_torus_links(
    topo: Topology,
    nodes: dict[tuple[int, ...], Node],
    dims: tuple[int, ...],
    *,
    capacity_Bps: float,
    latency_s: float,
    lanes: int,
    axes: Sequence[int] | None = None,
) -> None:
    """Link each node to its +1 neighbour (with wrap-around) along ``axes``, both directions.

    A ring of size 2 gets a single link per direction, a ring of size 1 none.
    """
    for axis in range(len(dims)) if axes is None else axes:
        size = dims[axis]
        if size < 2:
            continue
        for coord, node in nodes.items():
            if size == 2 and coord[axis] == 1:
                continue
            nxt = list(coord)
            nxt[axis] = (coord[axis] + 1) % size
            topo.add_duplex(
                node,
                nodes[tuple(nxt)],
                capacity_Bps=capacity_Bps,
                latency_s=latency_s,
                lanes=lanes,
                kind="neuronlink",
            )


def torus_path(
    src: tuple[int, ...], dst: tuple[int, ...], dims: tuple[int, ...]
) -> list[tuple[int, ...]]:
    """Dimension-order path on a torus: axis 0 first, shortest way round, ties go positive."""
    path = [src]
    cur = list(src)
    for axis, size in enumerate(dims):
        fwd = (dst[axis] - cur[axis]) % size
        step, hops = (1, fwd) if fwd <= size - fwd else (-1, size - fwd)
        for _ in range(hops):
            cur[axis] = (cur[axis] + step) % size
            path.append(tuple(cur))
    return path


def add_efa(topo: Topology, instance: InstanceSpec, chip: ChipSpec) -> None:
    """Scale-out fabric: one non-blocking switch ``("efa",)``; each chip has an up and a down
    link with its share of the instance's EFA bandwidth and half the one-way latency each.
    """
    cpi = topo.chips_per_instance
    cap = instance.efa.bandwidth_Bps / cpi * chip.calibration.link_efficiency
    up, down = [], []
    for c in range(topo.n_chips):
        a, b = topo.add_duplex(
            chip_node(c),
            EFA_NODE,
            capacity_Bps=cap,
            latency_s=instance.efa.latency_s / 2,
            kind="efa",
        )
        up.append(a)
        down.append(b)
    topo.set_scaleout_links(up, down)


def hierarchical_path(topo: Topology, intra: Callable[[int, int, int], Sequence[Node]]) -> PathFn:
    """Preferred paths: ``intra(instance, src_local, dst_local)`` inside an instance, EFA across."""
    cpi = topo.chips_per_instance

    def path(src: int, dst: int) -> Sequence[Node]:
        si, sl = divmod(src, cpi)
        di, dl = divmod(dst, cpi)
        if si == di:
            return intra(si, sl, dl)
        return (chip_node(src), EFA_NODE, chip_node(dst))

    return path


@register_topology("torus2d")
def build_torus2d(instance: InstanceSpec, chip: ChipSpec, count: int) -> Topology:
    """A 2D torus per instance (``fabric.dims = (X, Y)``), chips placed by :func:`snake_coords`."""
    fabric = instance.fabric
    dims = tuple(fabric.dims)
    if len(dims) != 2 or dims[0] * dims[1] != instance.chips:
        raise ScenarioError(
            f"instance.{instance.name}.fabric.dims",
            dims,
            f"torus2d needs two sizes whose product is the {instance.chips} chips of the instance",
        )
    dims2 = (dims[0], dims[1])
    coords = snake_coords(dims2)
    local_of = {c: i for i, c in enumerate(coords)}
    cpi = instance.chips
    topo = Topology(
        f"{instance.name}x{count}",
        chips_per_instance=cpi,
        instances=count,
        local_bw_Bps=chip.dma_bw_Bps,
    )
    cap = fabric.link_bw_Bps * chip.calibration.link_efficiency
    for inst in range(count):
        nodes: dict[tuple[int, ...], Node] = {
            c: chip_node(inst * cpi + i) for i, c in enumerate(coords)
        }
        add_torus_links(
            topo,
            nodes,
            dims2,
            capacity_Bps=cap,
            latency_s=fabric.link_latency_s,
            lanes=fabric.lanes,
        )

    def intra(inst: int, src: int, dst: int) -> list[Node]:
        base = inst * cpi
        return [
            chip_node(base + local_of[(c[0], c[1])])
            for c in torus_path(coords[src], coords[dst], dims2)
        ]

    topo.path_fn = hierarchical_path(topo, intra)
    if count > 1:
        add_efa(topo, instance, chip)
    return topo


@register_topology("switch")
def build_switch(instance: InstanceSpec, chip: ChipSpec, count: int) -> Topology:
    """One non-blocking switch per instance (NVSwitch; a Trn3 server's NeuronSwitch).

    Each chip has an up and a down link of ``fabric.link_bw_Bps``, each with half
    the chip-to-chip latency.
    """
    fabric = instance.fabric
    cpi = instance.chips
    topo = Topology(
        f"{instance.name}x{count}",
        chips_per_instance=cpi,
        instances=count,
        local_bw_Bps=chip.dma_bw_Bps,
    )
    cap = fabric.link_bw_Bps * chip.calibration.link_efficiency
    for inst in range(count):
        switch: Node = ("switch", inst)
        for i in range(cpi):
            topo.add_duplex(
                chip_node(inst * cpi + i),
                switch,
                capacity_Bps=cap,
                latency_s=fabric.link_latency_s / 2,
                lanes=fabric.lanes,
                kind="switch",
            )

    def intra(inst: int, src: int, dst: int) -> list[Node]:
        return [chip_node(inst * cpi + src), ("switch", inst), chip_node(inst * cpi + dst)]

    topo.path_fn = hierarchical_path(topo, intra)
    if count > 1:
        add_efa(topo, instance, chip)
    return topo
