"""``cluster.domain_fill``: UltraServer domains filled with fewer instances than they hold.

A number fills every domain with that many instances; ``last`` fills whole domains and
leaves the last one partly filled (:attr:`~clustersim.catalog.schema.UltraServerSpec.last_partial`:
the topology builds it at full size and its empty slots hold no ranks). Only NVLink switch
domains (nvl72), whose GPUs each reach the switch trays on their own links, may be partly
filled; Trainium UltraServers are built whole.
"""

from __future__ import annotations

from typing import Literal

from clustersim.catalog.schema import InstanceSpec
from clustersim.errors import ScenarioError

__all__ = ["filled"]


def filled(
    inst: InstanceSpec, fill: int | Literal["last"], fabric_file: str | None = None
) -> InstanceSpec:
    """``inst`` with ``fill`` instances in each scale-up domain (``cluster.domain_fill``), or
    with whole domains and the last one partly filled (``last``; not with a ``fabric_file``,
    which gives the fabric whole)."""
    us = inst.ultraserver
    if us is None:
        raise ScenarioError(
            "cluster.domain_fill", fill, f"{inst.name} forms no UltraServer: nothing to fill"
        )
    if fill == "last":
        if us.topology != "nvl72":
            raise ScenarioError(
                "cluster.domain_fill",
                fill,
                f"a {us.topology} UltraServer is built whole; only NVLink switch domains "
                "(nvl72) may be partly filled",
            )
        if fabric_file is not None:
            problem = "a partly filled last domain is built, not read from cluster.fabric_file"
            raise ScenarioError("cluster.domain_fill", fill, problem)
        return inst.model_copy(update={"ultraserver": us.partly_filled()})
    if fill > us.instances:
        raise ScenarioError(
            "cluster.domain_fill",
            fill,
            f"one {us.topology} domain holds 1 to {us.instances} {inst.name} instances",
        )
    if us.topology != "nvl72" and fill != us.instances:
        raise ScenarioError(
            "cluster.domain_fill",
            fill,
            f"a {us.topology} UltraServer is built whole; only NVLink switch domains (nvl72) "
            "may be partly filled",
        )
    return inst.model_copy(update={"ultraserver": us.model_copy(update={"instances": fill})})
