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
  every other rank at once: ``a + (p-1) n b``.

``pairwise`` runs all-to-all in p-1 rounds; in round ``r`` position ``i`` sends
its n/p block to ``(i + r) mod p``. The rounds use different pairs, so each is
its own step: ``(p-1)a + (p-1)/p · n b``.
"""

from __future__ import annotations

from clustersim.network.collectives import OPS, Step, register_algorithm
from clustersim.network.groups import GroupInfo

__all__ = ["mesh", "pairwise"]


def _all_pairs(p: int) -> tuple[tuple[int, int], ...]:
    return tuple((i, j) for i in range(p) for j in range(p) if i != j)


@register_algorithm("mesh", ops=OPS)
def mesh(op: str, p: int, nbytes: float, info: GroupInfo) -> list[Step]:
    """Every transfer of a phase at once; see the module doc."""
    del info
    if op == "broadcast":
        return [Step(tuple((0, j) for j in range(1, p)), nbytes)]
    if op == "reduce":
        return [Step(tuple((j, 0) for j in range(1, p)), nbytes, reduces=True)]
    pairs = _all_pairs(p)
    if op == "all_reduce":
        return [
            Step(pairs, nbytes / p, reduces=True),
            Step(pairs, nbytes / p),
        ]
    return [Step(pairs, nbytes / p, reduces=op == "reduce_scatter")]


@register_algorithm("pairwise", ops=("all_to_all",))
def pairwise(op: str, p: int, nbytes: float, info: GroupInfo) -> list[Step]:
    """All-to-all in p-1 shifted rounds; see the module doc."""
    del op, info
    return [Step(tuple((i, (i + r) % p) for i in range(p)), nbytes / p) for r in range(1, p)]
