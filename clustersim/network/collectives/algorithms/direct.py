"""Direct collectives: ``mesh`` (every pair at once) and ``pairwise`` (one shift per round).

``mesh`` posts all transfers of a phase together, as for small messages on a
switch fabric. With ``p`` ranks, an ``n``-byte buffer, latency ``a`` and ``b``
seconds per byte, through a non-blocking switch (each chip's up and down link
carry its p-1 flows):

- reduce-scatter: each rank sends shard ``j`` (n/p) straight to rank ``j``, one
  step of p(p-1) flows: ``a + (p-1)/p · n b``; all-gather likewise;
- all-reduce: direct reduce-scatter then direct all-gather, two identical
  steps: ``2a + 2(p-1)/p · n b``;
- all-to-all: one step of p(p-1) flows of n/p: ``a + (p-1)/p · n b``;
- broadcast (reduce): position 0 sends the whole buffer to (receives it from)
  every other rank at once: ``a + (p-1) n b``;
- scatter (gather): position 0 sends each other rank its n/p block (receives
  theirs) at once, p-1 flows through its link: ``a + (p-1)/p · n b``, as NCCL
  runs them (a group of sends and receives at the root).

``pairwise`` runs all-to-all in p-1 rounds; in round ``r`` position ``i`` sends
its n/p block to ``(i + r) mod p``. The rounds use different pairs, so each is
its own step: ``(p-1)a + (p-1)/p · n b``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from clustersim.network.collectives.groups import GroupInfo
from clustersim.network.collectives.registry import OPS, Step, StepArrays, register_algorithm

__all__ = ["mesh", "mesh_arrays", "pairwise", "pairwise_arrays"]

_NONE: tuple[tuple[int, int], ...] = ()


def _all_pairs(p: int) -> NDArray[np.int64]:
    """Every ordered pair ``(i, j)``, ``i != j``, in row-major order."""
    out = np.empty((p * (p - 1), 2), dtype=np.int64)
    out[:, 0] = np.repeat(np.arange(p, dtype=np.int64), p - 1)
    j = np.broadcast_to(np.arange(p - 1, dtype=np.int64), (p, p - 1)).copy()
    j += j >= np.arange(p, dtype=np.int64)[:, None]  # skip i itself
    out[:, 1] = j.ravel()
    return out


def _tuples(pairs: NDArray[np.int64]) -> tuple[tuple[int, int], ...]:
    return tuple(zip(pairs[:, 0].tolist(), pairs[:, 1].tolist(), strict=True))


def mesh_arrays(op: str, p: int, nbytes: float, info: GroupInfo) -> StepArrays:
    """:func:`mesh` with each step's pairs as an array."""
    del info
    others = np.arange(1, p, dtype=np.int64)
    root = np.zeros(p - 1, dtype=np.int64)
    if op == "broadcast":
        return [(Step(_NONE, nbytes), np.stack([root, others], axis=1))]
    if op == "reduce":
        return [(Step(_NONE, nbytes, reduces=True), np.stack([others, root], axis=1))]
    if op == "scatter":
        return [(Step(_NONE, nbytes / p), np.stack([root, others], axis=1))]
    if op == "gather":
        return [(Step(_NONE, nbytes / p), np.stack([others, root], axis=1))]
    pairs = _all_pairs(p)
    if op == "all_reduce":
        return [
            (Step(_NONE, nbytes / p, reduces=True), pairs),
            (Step(_NONE, nbytes / p), pairs),
        ]
    return [(Step(_NONE, nbytes / p, reduces=op == "reduce_scatter"), pairs)]


def pairwise_arrays(op: str, p: int, nbytes: float, info: GroupInfo) -> StepArrays:
    """:func:`pairwise` with each round's pairs as an array."""
    del op, info
    i = np.arange(p, dtype=np.int64)
    return [(Step(_NONE, nbytes / p), np.stack([i, (i + r) % p], axis=1)) for r in range(1, p)]


@register_algorithm("mesh", ops=OPS, arrays=mesh_arrays)
def mesh(op: str, p: int, nbytes: float, info: GroupInfo) -> list[Step]:
    """Every transfer of a phase at once; see the module doc."""
    return [
        Step(_tuples(pairs), s.bytes_per_flow, reduces=s.reduces)
        for s, pairs in mesh_arrays(op, p, nbytes, info)
    ]


@register_algorithm("pairwise", ops=("all_to_all",), arrays=pairwise_arrays)
def pairwise(op: str, p: int, nbytes: float, info: GroupInfo) -> list[Step]:
    """All-to-all in p-1 shifted rounds; see the module doc."""
    return [
        Step(_tuples(pairs), s.bytes_per_flow) for s, pairs in pairwise_arrays(op, p, nbytes, info)
    ]
