"""What a collective algorithm may know about where its group's ranks sit.

:class:`GroupInfo` describes a group by position ``0..p-1`` (the order the
caller gave the ranks): which positions share a chip, which share a scale-up
domain (an instance, or an UltraServer of several instances joined by
NeuronLink), and, on a torus fabric, each chip's torus coordinates within its
domain. Chip and domain ids are relabelled ``0, 1, ...`` in order of first
appearance, so two groups that are placed alike (the DP groups of different
TP ranks, say) have equal infos and share their cached steps.

:func:`group_info` derives it from a :class:`~clustersim.network.fabric.topology.Topology`: its
``chip_domain`` (the scale-up domain of each chip), ``chip_coords`` (each chip's
torus coordinates within its domain, or None) and ``torus_dims``. It works on
numpy arrays, so the info of a data-parallel group of 10^4 to 10^5 ranks costs
milliseconds.

:func:`torus_grid` arranges a group as a Cartesian grid, the input of the
``torus`` algorithm.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TypeAlias

import numpy as np
from numpy.typing import ArrayLike

from clustersim.network.fabric import Int64s, Topology

__all__ = ["GroupInfo", "group_info", "torus_grid"]

Coords: TypeAlias = tuple[int, ...]


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
        """``p`` positions on distinct chips of one domain, with no torus: no structure to use.

        One info per ``p`` (infos are immutable): the search's estimates ask for one per
        collective, and an info works out its domains once."""
        if cls is not GroupInfo:
            return cls(tuple(range(p)), (0,) * p)
        return _flat(p)

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
        return [list(members) for members in self._members]

    def domain_sizes(self) -> tuple[int, ...]:
        """Positions in each domain (domains in order of first appearance)."""
        return tuple(len(members) for members in self._members)

    @cached_property
    def _members(self) -> tuple[tuple[int, ...], ...]:
        # Worked out once per info: algorithms (and ``applies`` checks) ask for it repeatedly.
        domain = np.asarray(self.domain, dtype=np.int64)
        if not domain.size:
            return ()
        order = np.argsort(domain, kind="stable")
        ends = np.cumsum(np.bincount(domain))[:-1]
        return tuple(tuple(part.tolist()) for part in np.split(order, ends))


def _first_seen(ids: ArrayLike) -> Int64s:
    """``ids`` renumbered ``0, 1, ...`` in order of first appearance."""
    arr = np.asarray(ids, dtype=np.int64).reshape(-1)
    if not arr.size:
        return arr
    _, first, inverse = np.unique(arr, return_index=True, return_inverse=True)
    label = np.empty(first.size, dtype=np.int64)
    label[np.argsort(first)] = np.arange(first.size, dtype=np.int64)
    out: Int64s = label[inverse.reshape(-1)]
    return out


def _relabel(ids: ArrayLike) -> tuple[int, ...]:
    return tuple(_first_seen(ids).tolist())


def group_info(
    topology: Topology, chips: ArrayLike, cache: dict[bytes, GroupInfo] | None = None
) -> GroupInfo:
    """The :class:`GroupInfo` of a group whose position ``i`` runs on chip ``chips[i]``.

    With ``cache`` (a dict the caller keeps for this topology), groups placed
    alike get the same info object, built once: the data-parallel groups of
    every pipeline stage, say, whose infos each hold tens of thousands of tuples.
    """
    arr = np.asarray(chips, dtype=np.int64).reshape(-1)
    chip_ids = _first_seen(arr)
    domain_ids = _first_seen(topology.chip_domain[arr])
    coords = topology.chip_coords[arr] if topology.chip_coords is not None and arr.size else None
    key = b""
    if cache is not None:
        shape = np.asarray([arr.size, -1 if coords is None else coords.shape[1]], dtype=np.int64)
        parts = [shape, chip_ids, domain_ids] + ([] if coords is None else [coords.ravel()])
        key = hashlib.blake2b(b"".join(p.tobytes() for p in parts), digest_size=16).digest()
        found = cache.get(key)
        if found is not None:
            return found
    info = GroupInfo(
        tuple(chip_ids.tolist()),
        tuple(domain_ids.tolist()),
        () if coords is None else tuple(map(tuple, coords.tolist())),
        () if coords is None else topology.torus_dims,
    )
    if cache is not None:
        cache[key] = info
    return info


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


@lru_cache(maxsize=4096)
def _flat(p: int) -> GroupInfo:
    return GroupInfo(tuple(range(p)), (0,) * p)
