"""Dimension-ordered rings on a torus: ``torus``.

The group is laid out as a Cartesian grid (:func:`~..groups.torus_grid`): the
ranks of a chip, then each torus axis (x, y, z), then the scale-up domain, each
axis of size ``d_k >= 2``. Reduce-scatter runs a ring along axis 0 in every
line of the grid at once, then along axis 1 on the shard that is left, and so
on; all-gather goes back in reverse order; all-reduce is one then the other.
Every ring is bidirectional (``ring``): both directions of each link carry half.

With ``m_0 = n`` and ``m_{k+1} = m_k / d_k``, on a torus where a line's ring is
uncontended (latency ``a_k`` and ``b_k`` seconds per byte per direction along axis k):

- reduce-scatter, all-gather: ``sum_k (d_k - 1) a_k + (d_k - 1)/d_k · m_k b_k / c_k``,
  with ``c_k = 2`` for ``d_k >= 3`` (both directions) and 1 for ``d_k = 2``;
- all-reduce: twice that.

With equal links and ``d_k >= 3`` the bandwidth term telescopes to the
bidirectional ring's, ``(p-1)/p · n b / 2`` per phase, while the latency term
drops from ``(p-1) a`` to ``sum_k (d_k - 1) a``: 9a instead of 63a on 4x4x4.
Groups that are not a grid on a torus fall back to ``ring``.
"""

from __future__ import annotations

from clustersim.network.collectives.algorithms.ring import ring_step
from clustersim.network.collectives.groups import GroupInfo, torus_grid
from clustersim.network.collectives.registry import Step, register_algorithm

__all__ = ["grid_lines", "is_torus_grid", "torus"]


def is_torus_grid(p: int, info: GroupInfo) -> bool:
    del p
    return torus_grid(info) is not None


def grid_lines(grid: tuple[tuple[int, ...], ...], axis: int) -> list[list[int]]:
    """The positions of every grid line along ``axis``, each ordered by its coordinate."""
    lines: dict[tuple[int, ...], list[int]] = {}
    for pos, coord in sorted(enumerate(grid), key=lambda pc: pc[1][axis]):
        lines.setdefault(coord[:axis] + coord[axis + 1 :], []).append(pos)
    return list(lines.values())


@register_algorithm(
    "torus", ops=("all_reduce", "reduce_scatter", "all_gather"), applies=is_torus_grid
)
def torus(op: str, p: int, nbytes: float, info: GroupInfo) -> list[Step]:
    """Rings along each grid axis in turn; see the module doc."""
    found = torus_grid(info)
    if found is None:
        raise ValueError(f"torus needs a group laid out as a grid on a torus (got {info!r})")
    shape, grid = found
    scatter: list[Step] = []
    m = nbytes
    for axis, d in enumerate(shape):
        scatter.append(ring_step(grid_lines(grid, axis), m, d - 1))
        m /= d
    if op == "reduce_scatter":
        return scatter
    gather = scatter[::-1]
    if op == "all_gather":
        return gather
    return scatter + gather
