"""Recursive halving and doubling (Rabenseifner), for groups of a power-of-two size.

With ``p = 2^k`` ranks, an ``n``-byte buffer, latency ``a`` and ``b`` seconds per
byte, where every rank's exchange with its partner is uncontended (a switch):

- reduce-scatter, recursive vector halving: in round ``j = 0..k-1`` rank ``i``
  swaps half of what it still holds, ``n / 2^(j+1)``, with ``i XOR 2^j``:
  ``log2(p) a + (p-1)/p · n b``;
- all-gather, recursive doubling: the same rounds in reverse, each doubling
  what a rank holds: ``log2(p) a + (p-1)/p · n b``;
- all-reduce, reduce-scatter then all-gather: ``2 log2(p) a + 2(p-1)/p · n b``.

Partners start near (``i XOR 1``) and move away, so the largest exchanges are
between neighbours in group order, which are usually physically close. (Thakur,
Rabenseifner & Gropp, 2005; halving with distance doubling is the same cost as
MPICH's distance halving.) Other group sizes fall back to ``ring``.
"""

from __future__ import annotations

import numpy as np

from clustersim.network.collectives.groups import GroupInfo
from clustersim.network.collectives.registry import Step, StepArrays, register_algorithm

__all__ = ["halving_doubling", "halving_doubling_arrays", "is_power_of_two"]


def is_power_of_two(p: int, info: GroupInfo | None = None) -> bool:
    del info
    return p >= 1 and p & (p - 1) == 0


def _round(p: int, j: int, nbytes: float, *, reduces: bool) -> Step:
    dist = 1 << j
    return Step(tuple((i, i ^ dist) for i in range(p)), nbytes / (2 * dist), reduces=reduces)


def _rounds(op: str, k: int) -> list[tuple[int, bool]]:
    """Each round's ``j`` (partners ``2^j`` apart) and whether it reduces, in order."""
    halving = [(j, True) for j in range(k)]
    doubling = [(j, False) for j in reversed(range(k))]
    if op == "reduce_scatter":
        return halving
    if op == "all_gather":
        return doubling
    return halving + doubling


def halving_doubling_arrays(op: str, p: int, nbytes: float, info: GroupInfo) -> StepArrays:
    """:func:`halving_doubling` with each step's pairs as an array (the outer phase of a
    data-parallel group of 32,768 ranks has 4,096 ranks: no tuple per pair)."""
    del info
    if not is_power_of_two(p):
        raise ValueError(f"halving_doubling needs a power-of-two group (got {p} ranks)")
    ranks = np.arange(p, dtype=np.int64)
    pairs = {j: np.stack([ranks, ranks ^ (1 << j)], axis=1) for j in range(p.bit_length() - 1)}
    return [
        (Step((), nbytes / (2 * (1 << j)), reduces=reduces), pairs[j])
        for j, reduces in _rounds(op, p.bit_length() - 1)
    ]


@register_algorithm(
    "halving_doubling",
    ops=("all_reduce", "reduce_scatter", "all_gather"),
    applies=is_power_of_two,
    arrays=halving_doubling_arrays,
)
def halving_doubling(op: str, p: int, nbytes: float, info: GroupInfo) -> list[Step]:
    """Recursive halving (reduce-scatter) and doubling (all-gather); see the module doc."""
    del info
    if not is_power_of_two(p):
        raise ValueError(f"halving_doubling needs a power-of-two group (got {p} ranks)")
    k = p.bit_length() - 1
    halving = [_round(p, j, nbytes, reduces=True) for j in range(k)]
    doubling = [_round(p, j, nbytes, reduces=False) for j in reversed(range(k))]
    if op == "reduce_scatter":
        return halving
    if op == "all_gather":
        return doubling
    return halving + doubling
