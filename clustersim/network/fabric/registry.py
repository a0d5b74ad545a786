"""Registries of fabric builders, and :func:`build_topology`, which uses them.

Scale-up builders are registered by the name used in ``instance.ultraserver.topology``
when the instance has one, else ``instance.fabric.topology``
(:func:`register_topology`); scale-out fabrics by the name in ``efa.fabric``
(:func:`register_fabric`). The shipped ones live in
:mod:`clustersim.network.fabric.builders` and :mod:`clustersim.network.fabric.fabrics`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

from clustersim.catalog.schema import ChipSpec, EfaSpec, InstanceSpec
from clustersim.errors import ScenarioError
from clustersim.network.fabric.topology import Topology

__all__ = [
    "Builder",
    "FabricBuilder",
    "build_topology",
    "built_instances",
    "check_fabrics",
    "fabric_names",
    "register_fabric",
    "register_topology",
    "topology_names",
]

Builder: TypeAlias = Callable[[InstanceSpec, ChipSpec, int], Topology]
"""``(instance, chip, count) -> Topology``: the scale-up fabric of ``count`` instances."""

FabricBuilder: TypeAlias = Callable[[Topology, EfaSpec, float, str], None]
"""``(topology, efa, link_efficiency, key_path)``: attach a scale-out fabric to every chip."""

_BUILDERS: dict[str, Builder] = {}
_FABRICS: dict[str, FabricBuilder] = {}


def register_topology(name: str) -> Callable[[Builder], Builder]:
    """Register a scale-up builder under the name used in ``fabric.topology`` or
    ``ultraserver.topology``."""

    def deco(fn: Builder) -> Builder:
        if name in _BUILDERS:
            raise ValueError(f"topology {name!r} is already registered")
        _BUILDERS[name] = fn
        return fn

    return deco


def register_fabric(name: str) -> Callable[[FabricBuilder], FabricBuilder]:
    """Register a scale-out fabric builder under the name used in ``efa.fabric``."""

    def deco(fn: FabricBuilder) -> FabricBuilder:
        if name in _FABRICS:
            raise ValueError(f"fabric {name!r} is already registered")
        _FABRICS[name] = fn
        return fn

    return deco


def topology_names() -> list[str]:
    return sorted(_BUILDERS)


def fabric_names() -> list[str]:
    return sorted(_FABRICS)


def check_fabrics(
    instance: InstanceSpec, count: int, *, path: str = "cluster"
) -> tuple[Builder, FabricBuilder]:
    """The scale-up builder and scale-out fabric that :func:`build_topology` would use,
    checked against ``count`` without building anything (errors name ``path`` keys)."""
    us = instance.ultraserver
    if us is not None:
        name, where = us.topology, f"{path}.ultraserver.topology"
    else:
        name, where = instance.fabric.topology, f"{path}.neuronlink.topology"
    builder = _BUILDERS.get(name)
    if builder is None:
        raise ScenarioError(where, name, f"unknown topology; valid: {', '.join(topology_names())}")
    if count < 1:
        raise ScenarioError(f"{path}.count", count, "must be at least 1")
    if us is not None and count % us.instances and not us.last_partial:
        fewer = (
            " (cluster.domain_fill puts fewer in each; cluster.domain_fill: last fills the "
            "last one partly)"
        )
        raise ScenarioError(
            f"{path}.count",
            count,
            f"must be a multiple of {us.instances}: {us.instances} {instance.name} instances "
            "form one UltraServer" + (fewer if us.topology == "nvl72" else ""),
        )
    fabric = _FABRICS.get(instance.efa.fabric)
    if fabric is None:
        raise ScenarioError(
            f"{path}.efa.fabric",
            instance.efa.fabric,
            f"unknown scale-out fabric; valid: {', '.join(fabric_names())}",
        )
    return builder, fabric


def built_instances(instance: InstanceSpec, count: int) -> int:
    """The instances a topology of ``count`` is built with: ``count``, rounded up to whole
    domains where the last UltraServer domain may be partly filled (its empty slots are
    built and hold no ranks)."""
    us = instance.ultraserver
    if us is None or not us.last_partial:
        return count
    return -(-count // us.instances) * us.instances


def build_topology(
    instance: InstanceSpec, chip: ChipSpec, count: int, *, path: str = "cluster"
) -> Topology:
    """Build ``count`` instances: their scale-up fabric, then the scale-out fabric.

    The scale-up builder is named by ``instance.ultraserver.topology`` when the
    instance belongs to an UltraServer (``count`` must then fill whole
    UltraServers, or, with ``ultraserver.last_partial``, is rounded up to whole ones
    whose last chips hold no ranks: :attr:`Topology.filled_chips`), else by
    ``instance.fabric.topology``. When there is more than
    one scale-up domain, the fabric named by ``instance.efa.fabric`` joins them.
    ``path`` prefixes the key paths of errors.
    """
    builder, fabric = check_fabrics(instance, count, path=path)
    topo = builder(instance, chip, built_instances(instance, count))
    topo.filled_chips = count * instance.chips
    if topo.n_domains > 1 and topo.scaleout is None:
        fabric(topo, instance.efa, chip.efa_link_efficiency, path)
    return topo
