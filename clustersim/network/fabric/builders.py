"""Scale-up topology builders, registered by name (importing this module registers them).

A builder makes the scale-up fabric of ``count`` instances: the links inside each
scale-up *domain* and a path function for the chip pairs of a domain.
:func:`~clustersim.network.fabric.registry.build_topology` then joins the domains by the
scale-out fabric named in ``efa.fabric`` (:mod:`clustersim.network.fabric.fabrics`).

Named by ``instance.fabric.topology`` (the domain is one instance):

- ``torus2d``: a 2D torus of NeuronLink per instance (Trn1, Trn2), chips placed
  along a snake so that chip order is a Hamiltonian cycle; dimension-order routes.
- ``switch``: one non-blocking switch per instance (NVSwitch; a Trn3 server).

Named by ``instance.ultraserver.topology`` (the domain is an UltraServer of
``ultraserver.instances`` consecutive instances):

- ``torus3d``: Trn2 UltraServer. Each instance is a 2D torus in the (x, y) plane
  with ``fabric`` links; chips at the same (x, y) in the UltraServer's instances
  form a Z ring of ``ultraserver`` links: a 4x4x4 torus. Dimension-order routes,
  x then y then z.
- ``neuronswitch``: Trn3 Gen2 UltraServer. A NeuronSwitch per server (chips
  attach with ``fabric`` links) and :data:`NEURONSWITCH_SPINES` second-level
  switches that join the servers of the UltraServer. Each server switch has one
  link to each spine of ``chips x ultraserver.link_bw_Bps / spines``, so a chip's
  bandwidth across servers equals its NeuronLink bandwidth
  (``ultraserver.link_bw_Bps``) and the tier is non-blocking. Pairs in different
  servers take one spine, chosen like ECMP (destination position plus a hash of
  the server pair).
- ``nvl72``: GB200 NVL72. All GPUs of the domain (18 trays x 4) reach each other
  through the NVLink switch tray tier at full per-GPU bandwidth: one non-blocking
  switch, each GPU attached with ``ultraserver`` links (its 18 NVLinks are lanes
  of that link when ``fabric.lanes`` says so).

Chip links use the chip's ``link_efficiency``; every link gets ``fabric.lanes`` lanes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from clustersim.catalog.schema import ChipSpec, InstanceSpec, UltraServerSpec
from clustersim.errors import ScenarioError
from clustersim.network.fabric import fabrics
from clustersim.network.fabric.domainpaths import LocalPaths
from clustersim.network.fabric.registry import register_topology
from clustersim.network.fabric.topology import Node, Topology, ecmp_hash, local_path

__all__ = [
    "NEURONSWITCH_SPINES",
    "add_domain_torus",
    "add_efa",
    "add_torus_links",
    "build_neuronswitch",
    "build_nvl72",
    "build_switch",
    "build_torus2d",
    "build_torus3d",
    "snake_coords",
    "torus_domain_coords",
    "torus_path",
]

NEURONSWITCH_SPINES = 2
"""Second-level NeuronSwitches of a Trn3 Gen2 UltraServer
(aws-neuron-sdk:about-neuron/arch/neuron-hardware/trn3-arch.rst)."""


def snake_coords(dims: tuple[int, int]) -> list[tuple[int, int]]:
    """Torus coordinates ``(x, y)`` of local chips 0..X*Y-1 along a boustrophedon.

    Row ``y`` is walked left to right when even and right to left when odd, so
    consecutive chips are neighbours, and with an even number of rows the last
    chip, at ``(0, Y-1)``, neighbours chip 0 through the y wrap-around: the chip
    order is a Hamiltonian cycle of the torus, and a ring over it is contention free.
    """
    nx_, ny = dims
    return [(k if y % 2 == 0 else nx_ - 1 - k, y) for y in range(ny) for k in range(nx_)]


def torus_domain_coords(
    instance: InstanceSpec,
) -> tuple[list[tuple[int, ...]], tuple[int, ...]] | None:
    """Where the torus builders place a scale-up domain's chips: each local chip's
    coordinates and the torus's axis sizes, or None when the domain is no torus.

    ``torus2d``: the instance's plane along :func:`snake_coords`; ``torus3d``: the
    UltraServer's instances stacked along z, each plane along the snake.
    """
    us = instance.ultraserver
    if us is not None:
        if us.topology != "torus3d":
            return None
        nx_, ny = _plane(instance, "torus3d")
        coords: list[tuple[int, ...]] = [
            (x, y, z) for z in range(us.instances) for x, y in snake_coords((nx_, ny))
        ]
        return coords, (nx_, ny, us.instances)
    if instance.fabric.topology != "torus2d":
        return None
    dims = _plane(instance, "torus2d")
    return list(snake_coords(dims)), dims


def torus_path(
    src: tuple[int, ...], dst: tuple[int, ...], dims: tuple[int, ...]
) -> list[tuple[int, ...]]:
    """Dimension-order path on a torus: axis 0 first, shortest way round. A peer half
    way round an even ring (a tie) is reached the positive way from an even
    coordinate on that axis and the negative way from an odd one, so the ties of a
    ring's members split evenly over its two directions."""
    path = [src]
    cur = list(src)
    for axis, size in enumerate(dims):
        fwd = (dst[axis] - cur[axis]) % size
        positive = fwd < size - fwd or (fwd == size - fwd and cur[axis] % 2 == 0)
        step, hops = (1, fwd) if positive else (-1, size - fwd)
        for _ in range(hops):
            cur[axis] = (cur[axis] + step) % size
            path.append(tuple(cur))
    return path


def _ring_pairs(
    coords: Sequence[tuple[int, ...]], dims: tuple[int, ...], axis: int
) -> tuple[list[int], list[int]]:
    """Each point's +1 neighbour along ``axis``; a ring of size 2 has one link, of size 1 none."""
    size = dims[axis]
    index = {c: i for i, c in enumerate(coords)}
    us: list[int] = []
    vs: list[int] = []
    if size < 2:
        return us, vs
    for i, c in enumerate(coords):
        if size == 2 and c[axis] == 1:
            continue
        nxt = list(c)
        nxt[axis] = (c[axis] + 1) % size
        us.append(i)
        vs.append(index[tuple(nxt)])
    return us, vs


def add_domain_torus(
    topo: Topology,
    coords: Sequence[tuple[int, ...]],
    dims: tuple[int, ...],
    *,
    capacity_Bps: Sequence[float],
    latency_s: Sequence[float],
    lanes: int,
) -> None:
    """Make every domain a torus: local chip ``i`` of each domain sits at ``coords[i]``.

    ``capacity_Bps`` and ``latency_s`` are per axis. All domains are built at once.
    """
    n_local = len(coords)
    base = np.arange(topo.n_chips // n_local, dtype=np.int64)[:, None] * n_local
    for axis in range(len(dims)):
        us, vs = _ring_pairs(coords, dims, axis)
        if us:
            topo.add_duplex_links(
                (base + np.asarray(us)).ravel(),
                (base + np.asarray(vs)).ravel(),
                capacity_Bps=capacity_Bps[axis],
                latency_s=latency_s[axis],
                lanes=lanes,
                kind="neuronlink",
            )


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
    coords = list(nodes)
    ids = topo.add_nodes(nodes[c] for c in coords)
    for axis in range(len(dims)) if axes is None else axes:
        us, vs = _ring_pairs(coords, dims, axis)
        if us:
            topo.add_duplex_links(
                ids[us],
                ids[vs],
                capacity_Bps=capacity_Bps,
                latency_s=latency_s,
                lanes=lanes,
                kind="neuronlink",
            )


def add_efa(topo: Topology, instance: InstanceSpec, chip: ChipSpec) -> None:
    """The ``nonblocking`` scale-out fabric (one switch ``("efa",)``) for ``topo``."""
    fabrics.attach_nonblocking(topo, instance.efa, chip.efa_link_efficiency, "cluster")


def _set_torus_paths(
    topo: Topology, domain_chips: int, coords: Sequence[tuple[int, ...]], dims: tuple[int, ...]
) -> None:
    """Route inside every domain of ``topo`` by :func:`torus_path`: its ``path_fn``, and
    the same paths as one table (:class:`~.domainpaths.LocalPaths`) for routing in bulk."""
    local_of = {c: i for i, c in enumerate(coords)}
    # Every domain is the same torus: a path is found once per pair of local chips
    # (at most domain_chips^2 of them) and shifted to each domain's chips.
    found: dict[tuple[int, int], list[int]] = {}

    def local(a: int, b: int) -> list[int]:
        nodes = found.get((a, b))
        if nodes is None:
            nodes = found[(a, b)] = [local_of[c] for c in torus_path(coords[a], coords[b], dims)]
        return nodes

    def path(src: int, dst: int) -> list[int]:
        base = src - src % domain_chips
        return [base + x for x in local(src - base, dst - base)]

    topo.path_fn = path
    topo.local_paths = LocalPaths(domain_chips, local)


def _plane(instance: InstanceSpec, builder: str) -> tuple[int, int]:
    dims = tuple(instance.fabric.dims)
    if len(dims) != 2 or dims[0] * dims[1] != instance.chips:
        raise ScenarioError(
            f"instance.{instance.name}.fabric.dims",
            dims,
            f"{builder} needs two sizes whose product is the instance's {instance.chips} chips",
        )
    return dims[0], dims[1]


def _ultraserver(instance: InstanceSpec, builder: str) -> UltraServerSpec:
    if instance.ultraserver is None:
        raise ScenarioError(
            f"instance.{instance.name}.ultraserver", None, f"{builder} needs an ultraserver section"
        )
    return instance.ultraserver


def _topology(instance: InstanceSpec, chip: ChipSpec, count: int, per_domain: int) -> Topology:
    local_Bps, local_s = local_path(chip)
    return Topology(
        f"{instance.name}x{count}",
        chips_per_instance=instance.chips,
        instances=count,
        local_bw_Bps=local_Bps,
        local_latency_s=local_s,
        domain_instances=per_domain,
    )


@register_topology("torus2d")
def build_torus2d(instance: InstanceSpec, chip: ChipSpec, count: int) -> Topology:
    """A 2D torus per instance (``fabric.dims = (X, Y)``), chips placed by :func:`snake_coords`."""
    fabric = instance.fabric
    dims = _plane(instance, "torus2d")
    coords: list[tuple[int, ...]] = list(snake_coords(dims))
    topo = _topology(instance, chip, count, 1)
    cap = fabric.link_bw_Bps * chip.calibration.link_efficiency
    add_domain_torus(
        topo,
        coords,
        dims,
        capacity_Bps=(cap, cap),
        latency_s=(fabric.link_latency_s,) * 2,
        lanes=fabric.lanes,
    )
    topo.set_chip_coords(np.tile(np.asarray(coords), (count, 1)), dims)
    _set_torus_paths(topo, instance.chips, coords, dims)
    return topo


@register_topology("torus3d")
def build_torus3d(instance: InstanceSpec, chip: ChipSpec, count: int) -> Topology:
    """Trn2 UltraServer: ``ultraserver.instances`` 2D tori stacked into a 3D torus by Z rings."""
    fabric, us = instance.fabric, _ultraserver(instance, "torus3d")
    placed = torus_domain_coords(instance)
    assert placed is not None  # an UltraServer of torus3d, checked above
    coords, dims = placed
    topo = _topology(instance, chip, count, us.instances)
    eff = chip.calibration.link_efficiency
    xy, z = fabric.link_bw_Bps * eff, us.link_bw_Bps * eff
    add_domain_torus(
        topo,
        coords,
        dims,
        capacity_Bps=(xy, xy, z),
        latency_s=(fabric.link_latency_s, fabric.link_latency_s, us.link_latency_s),
        lanes=fabric.lanes,
    )
    topo.set_chip_coords(np.tile(np.asarray(coords), (topo.n_domains, 1)), dims)
    _set_torus_paths(topo, topo.chips_per_domain, coords, dims)
    return topo


def _attach_to_switches(
    topo: Topology, switch_of_chip: ArrayLike, capacity_Bps: float, latency_s: float, lanes: int
) -> None:
    chips = np.arange(topo.n_chips, dtype=np.int64)
    topo.add_duplex_links(
        chips,
        switch_of_chip,
        capacity_Bps=capacity_Bps,
        latency_s=latency_s,
        lanes=lanes,
        kind="switch",
    )


@register_topology("switch")
def build_switch(instance: InstanceSpec, chip: ChipSpec, count: int) -> Topology:
    """One non-blocking switch per instance (NVSwitch; a Trn3 server's NeuronSwitch).

    Each chip has an up and a down link of ``fabric.link_bw_Bps``, each with half
    the chip-to-chip latency.
    """
    fabric, cpi = instance.fabric, instance.chips
    topo = _topology(instance, chip, count, 1)
    switches = topo.add_nodes(("switch", i) for i in range(count))
    cap = fabric.link_bw_Bps * chip.calibration.link_efficiency
    chips = np.arange(topo.n_chips)
    _attach_to_switches(topo, switches[chips // cpi], cap, fabric.link_latency_s / 2, fabric.lanes)
    ids = switches.tolist()

    def path(src: int, dst: int) -> list[int]:
        return [src, ids[src // cpi], dst]

    topo.path_fn = path
    return topo


@register_topology("neuronswitch")
def build_neuronswitch(instance: InstanceSpec, chip: ChipSpec, count: int) -> Topology:
    """Trn3 Gen2 UltraServer: a switch per server, two spine switches per UltraServer."""
    fabric, us, cpi = instance.fabric, _ultraserver(instance, "neuronswitch"), instance.chips
    eff = chip.calibration.link_efficiency
    topo = _topology(instance, chip, count, us.instances)
    switches = topo.add_nodes(("switch", i) for i in range(count))
    spines = topo.add_nodes(
        ("nlspine", d, j) for d in range(topo.n_domains) for j in range(NEURONSWITCH_SPINES)
    )
    chips = np.arange(topo.n_chips)
    _attach_to_switches(
        topo,
        switches[chips // cpi],
        fabric.link_bw_Bps * eff,
        fabric.link_latency_s / 2,
        fabric.lanes,
    )
    servers = np.repeat(np.arange(count), NEURONSWITCH_SPINES)
    spine_index = (servers // us.instances) * NEURONSWITCH_SPINES + np.tile(
        np.arange(NEURONSWITCH_SPINES), count
    )
    topo.add_duplex_links(
        switches[servers],
        spines[spine_index],
        capacity_Bps=cpi * us.link_bw_Bps * eff / NEURONSWITCH_SPINES,
        latency_s=us.link_latency_s / 2,
        lanes=fabric.lanes,
        kind="switch",
    )
    switch_ids, spine_ids = switches.tolist(), spines.tolist()

    def path(src: int, dst: int) -> list[int]:
        si, di = src // cpi, dst // cpi
        if si == di:
            return [src, switch_ids[si], dst]
        j = (dst % cpi + int(ecmp_hash(si, di))) % NEURONSWITCH_SPINES
        spine = spine_ids[(si // us.instances) * NEURONSWITCH_SPINES + j]
        return [src, switch_ids[si], spine, switch_ids[di], dst]

    topo.path_fn = path
    return topo


@register_topology("nvl72")
def build_nvl72(instance: InstanceSpec, chip: ChipSpec, count: int) -> Topology:
    """GB200 NVL72: every GPU of the NVLink domain on one non-blocking switch tier."""
    fabric, us = instance.fabric, _ultraserver(instance, "nvl72")
    topo = _topology(instance, chip, count, us.instances)
    switches = topo.add_nodes(("nvlswitch", d) for d in range(topo.n_domains))
    chips = np.arange(topo.n_chips)
    cap = us.link_bw_Bps * chip.calibration.link_efficiency
    domain = chips // topo.chips_per_domain
    _attach_to_switches(topo, switches[domain], cap, us.link_latency_s / 2, fabric.lanes)
    ids, per = switches.tolist(), topo.chips_per_domain

    def path(src: int, dst: int) -> list[int]:
        return [src, ids[src // per], dst]

    topo.path_fn = path
    return topo
