"""Binomial-tree collectives: ``tree``, for latency-bound messages and any group size.

With ``p`` ranks, ``K = ceil(log2 p)``, an ``n``-byte buffer, latency ``a`` and
``b`` seconds per byte, where each round's exchanges are uncontended:

- broadcast from position 0: in round ``j = 0..K-1`` every rank ``i < 2^j`` that
  holds the buffer sends all of it to ``i + 2^j``: ``K (a + n b)``;
- reduce to position 0: the same rounds in reverse, partial sums flowing up:
  ``K (a + n b)``;
- all-reduce: reduce, then broadcast: ``2K (a + n b)``.

The rounds are not pipelined (a double binary tree, as NCCL runs, would
stream chunks and trade latency for bandwidth); this is the latency-optimal
schedule for small messages.
"""

from __future__ import annotations

from clustersim.network.collectives.groups import GroupInfo
from clustersim.network.collectives.registry import Step, register_algorithm

__all__ = ["tree"]


def _broadcast_rounds(p: int, nbytes: float) -> list[Step]:
    rounds = []
    span = 1
    while span < p:
        rounds.append(Step(tuple((i, i + span) for i in range(span) if i + span < p), nbytes))
        span *= 2
    return rounds


@register_algorithm("tree", ops=("all_reduce", "broadcast", "reduce"))
def tree(op: str, p: int, nbytes: float, info: GroupInfo) -> list[Step]:
    """Binomial tree rooted at position 0; see the module doc."""
    del info
    down = _broadcast_rounds(p, nbytes)
    up = [
        Step(tuple((b, a) for a, b in s.pairs), s.bytes_per_flow, reduces=True)
        for s in reversed(down)
    ]
    if op == "broadcast":
        return down
    if op == "reduce":
        return up
    return up + down
