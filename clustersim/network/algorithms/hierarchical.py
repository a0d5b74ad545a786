"""Hierarchical collectives: inside each scale-up domain, then across, then inside again.

A scale-up domain is an instance, or an UltraServer of instances joined by
NeuronLink (:class:`~..groups.GroupInfo`). The group must hold the same number
``L >= 2`` of ranks in each of ``D >= 2`` domains; a rank's *local index* is its
order among its domain's ranks in the group. With an ``n``-byte buffer:

- all-reduce: reduce-scatter of n inside every domain at once (NeuronLink);
  all-reduce of the n/L shard among the D ranks of each local index at once
  (EFA); all-gather of n inside every domain;
- reduce-scatter: the first two phases, with a reduce-scatter across;
- all-gather: all-gather of n/L across, then of n inside.

Each phase runs the algorithm ``auto`` would pick for its size (``mesh``,
``halving_doubling`` or ``ring`` on L or D ranks), so the time is the sum of
those algorithms' costs on the domain fabric and on the scale-out one. For large
buffers, with a ring inside (``a1``, ``b1``) and across (``a2``, ``b2``):
``T = 2 T_rs(L, n; a1, b1) + T_ar(D, n/L; a2, b2)``: EFA carries n/L per rank,
not the ~2n of a flat ring. Groups that are not spread like this fall back to
``ring``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from clustersim.network.collectives import Step, collective_steps, register_algorithm
from clustersim.network.groups import GroupInfo

__all__ = ["hierarchical", "is_hierarchical", "parallel_steps"]


def is_hierarchical(p: int, info: GroupInfo) -> bool:
    """Whether the group spans several domains with the same number (> 1) of ranks in each."""
    del p
    sizes = info.domain_sizes()
    return len(sizes) > 1 and sizes[0] > 1 and len(set(sizes)) == 1


def parallel_steps(steps: Sequence[Step], groups: Sequence[Sequence[int]]) -> list[Step]:
    """``steps`` (over positions ``0..q-1``) run at once in every group of ``q`` positions.

    A step's pairs list every group's in turn (the first group's pairs, then the
    second's, ...). The mapping is one numpy gather per step: the inner and outer
    phases of a data-parallel group of 10^4 ranks hold 10^5 pairs.
    """
    if not groups:
        return [replace(step, pairs=()) for step in steps]
    table = np.asarray(groups, dtype=np.int64)
    out = []
    for step in steps:
        local = np.asarray(step.pairs, dtype=np.int64).reshape(-1, 2)
        mapped = table[:, local]
        pairs = zip(mapped[:, :, 0].ravel().tolist(), mapped[:, :, 1].ravel().tolist(), strict=True)
        out.append(replace(step, pairs=tuple(pairs)))
    return out


def _phase(op: str, groups: Sequence[Sequence[int]], nbytes: float) -> list[Step]:
    q = len(groups[0])
    return parallel_steps(collective_steps(op, q, nbytes, "auto", GroupInfo.flat(q)), groups)


@register_algorithm(
    "hierarchical",
    ops=("all_reduce", "reduce_scatter", "all_gather"),
    applies=is_hierarchical,
)
def hierarchical(op: str, p: int, nbytes: float, info: GroupInfo) -> list[Step]:
    """Inside the domains, across them, and inside again; see the module doc."""
    if not is_hierarchical(p, info):
        raise ValueError(
            "hierarchical needs the same number (> 1) of ranks in each of several domains"
        )
    inner = info.domain_members()
    outer = [list(peers) for peers in zip(*inner, strict=True)]
    local = len(inner[0])
    shard = nbytes / local
    if op == "reduce_scatter":
        return _phase("reduce_scatter", inner, nbytes) + _phase("reduce_scatter", outer, shard)
    if op == "all_gather":
        return _phase("all_gather", outer, shard) + _phase("all_gather", inner, nbytes)
    return (
        _phase("reduce_scatter", inner, nbytes)
        + _phase("all_reduce", outer, shard)
        + _phase("all_gather", inner, nbytes)
    )
