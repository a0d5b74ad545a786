"""What a collective algorithm may know about where its group's ranks sit.

:class:`GroupInfo` describes a group by position ``0..p-1`` (the order the
caller gave the ranks): which positions share a chip, which share a scale-up
domain (an instance, or an UltraServer of several instances joined by
NeuronLink), and, on a torus fabric, each chip's torus coordinates within its
domain. Chip and domain ids are relabelled ``0, 1, ...`` in order of first
appearance, so two groups that are placed alike (the DP groups of different
TP ranks, say) have equal infos and share their cached steps.

:func:`group_info` derives it from a :class:`~.topology.Topology`: its
``chip_domain`` (the scale-up domain of each chip), ``chip_coords`` (each chip's
torus coordinates within its domain, or None) and ``torus_dims``.

:func:`torus_grid` arranges a group as a Cartesian grid, the input of the
``torus`` algorithm.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

from clustersim.network.topology import Topology

__all__ = ["GroupInfo", "Placement", "chip_placement", "group_info", "torus_grid"]

Coords: TypeAlias = tuple[int, ...]

Placement: TypeAlias = tuple[tuple[int, ...], tuple[Coords, ...] | None, Coords]
"""Per chip of a topology: its domain, its torus coordinates (or None), and the torus dims."""


@dataclass(frozen=True)
class GroupInfo:
    """Placement of a group's positions: chip, scale-up domain and torus coordinates.

    ``chip[i]`` and ``domain[i]`` are relabelled ids of position ``i``'s chip and
    domain; ``coords[i]`` is its chip's torus coordinate within the domain, and
    ``dims`` the torus size per axis (both empty when the fabric is no torus).
    """

    chip: tuple[int, ...]
    domain: tuple[int, ...]
    coords: tuple[Coords, ...] = ()
    dims: Coords = ()

    def __post_init__(self) -> None:
        p = len(self.chip)
        if len(self.domain) != p or (self.coords and len(self.coords) != p):
            raise ValueError(f"GroupInfo needs one chip, domain and coords per position: {self!r}")
        if self.coords and any(len(c) != len(self.dims) for c in self.coords):
            raise ValueError(f"GroupInfo coords must have one entry per torus axis {self.dims}")

    @property
    def p(self) -> int:
        return len(self.chip)

    @classmethod
    def flat(cls, p: int) -> GroupInfo:
        """``p`` positions on distinct chips of one domain, with no torus: no structure to use."""
        return cls(tuple(range(p)), (0,) * p)

    @classmethod
    def of(
        cls,
        chips: Sequence[int],
        domains: Sequence[int],
        coords: Sequence[Coords] | None = None,
        dims: Sequence[int] = (),
    ) -> GroupInfo:
        """An info with ``chips`` and ``domains`` relabelled in order of first appearance."""
        return cls(
            _relabel(chips),
            _relabel(domains),
            tuple(tuple(int(x) for x in c) for c in coords) if coords else (),
            tuple(int(d) for d in dims) if coords else (),
        )

    def domain_members(self) -> list[list[int]]:
        """Positions of each domain (domains in order of first appearance), in group order."""
        members: list[list[int]] = [[] for _ in range(max(self.domain, default=-1) + 1)]
        for pos, dom in enumerate(self.domain):
            members[dom].append(pos)
        return members


def _relabel(ids: Sequence[int]) -> tuple[int, ...]:
    seen: dict[int, int] = {}
    return tuple(seen.setdefault(int(i), len(seen)) for i in ids)


def chip_placement(topology: Topology) -> Placement:
    """Per chip: its scale-up domain and torus coordinates, and the torus dims (see module doc)."""
    domains = tuple(int(d) for d in topology.chip_domain.tolist())
    coords = topology.chip_coords
    if coords is None:
        return domains, None, ()
    rows = tuple(tuple(int(x) for x in row) for row in coords.tolist())
    return domains, rows, tuple(int(d) for d in topology.torus_dims)


def group_info(
    topology: Topology,
    chips: Sequence[int],
    placement: Placement | None = None,
) -> GroupInfo:
    """The :class:`GroupInfo` of a group whose position ``i`` runs on chip ``chips[i]``.

    ``placement`` is :func:`chip_placement` of ``topology``, when the caller keeps it.
    """
    domains, coords, dims = placement if placement is not None else chip_placement(topology)
    return GroupInfo.of(
        chips,
        [domains[c] for c in chips],
        [coords[c] for c in chips] if coords is not None else None,
        dims,
    )


def torus_grid(info: GroupInfo) -> tuple[Coords, tuple[Coords, ...]] | None:
    """The group as a Cartesian grid: its shape, and each position's grid coordinate.

    The axes are, in order: the rank's index among the group's ranks on its chip,
    the torus axes, and the scale-up domain; axes of size 1 are dropped. Along
    each axis the grid follows increasing coordinates, so on a full torus axis a
    grid line is a physical ring. ``None`` when the fabric is no torus, or the
    group is not a full grid (every combination of the values it uses on each
    axis, each held by the same number of ranks).
    """
    if not info.coords:
        return None
    on_chip: dict[int, int] = {}
    points: list[tuple[int, ...]] = []
    for pos in range(info.p):
        local = on_chip.get(info.chip[pos], 0)
        on_chip[info.chip[pos]] = local + 1
        points.append((local, *info.coords[pos], info.domain[pos]))
    values = [sorted({pt[axis] for pt in points}) for axis in range(len(points[0]))]
    if len(set(points)) != info.p or math.prod(len(v) for v in values) != info.p:
        return None
    keep = [axis for axis, v in enumerate(values) if len(v) > 1]
    index = [{v: i for i, v in enumerate(vals)} for vals in values]
    shape = tuple(len(values[axis]) for axis in keep)
    grid = tuple(tuple(index[axis][pt[axis]] for axis in keep) for pt in points)
    return shape, grid
