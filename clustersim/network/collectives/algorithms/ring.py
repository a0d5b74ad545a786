"""Ring collectives: ``ring`` (bidirectional, the default) and ``ring_uni``.

Ranks sit on a ring in the order the group is given. With ``p`` ranks, an
``n``-byte buffer, per-hop latency ``a`` and ``b`` seconds per byte of one
direction of a link, on a ring whose links carry both directions (a duplex
ring, a torus line, the snake of a 2D torus):

``ring_uni`` (every rank sends to its successor):

- all-reduce: reduce-scatter then all-gather, 2(p-1) rounds of n/p:
  ``2(p-1)a + 2(p-1)/p · n b``;
- reduce-scatter, all-gather: p-1 rounds of n/p: ``(p-1)a + (p-1)/p · n b``;
- broadcast, reduce (root at position 0): a pipelined chain 0 -> 1 -> ... -> p-1
  (reversed for reduce) in the limit of fine chunks: the pipeline fills over p-1
  hops, then the buffer streams at link rate: ``(p-1)a + n b``; one step of p-1
  rounds of n/(p-1) per link.

``ring`` splits the buffer in two halves that travel the ring in opposite
directions at once, each half a ``ring_uni`` collective on n/2 bytes. The two
use opposite directions of each link, so on a duplex ring they do not
contend, and the time is that of one half:

- all-reduce: ``2(p-1)a + 2(p-1)/p · (n/2) b = 2(p-1)a + (p-1)/p · n b``;
- reduce-scatter, all-gather: ``(p-1)a + (p-1)/p · (n/2) b``;
- broadcast, reduce: chains 0 -> 1 -> ... -> p-1 and 0 -> p-1 -> ... -> 1, each
  with half the buffer: ``(p-1)a + (n/2) b``.

With p = 2 both directions of the one link are already in use, and ``ring`` is
``ring_uni``. Through a switch (one up and one down link per chip) the two
directions share the chip's links, and ``ring`` costs what ``ring_uni`` does.
"""

from __future__ import annotations

from collections.abc import Sequence

from clustersim.network.collectives.groups import GroupInfo
from clustersim.network.collectives.registry import Step, register_algorithm

__all__ = ["ring", "ring_pairs", "ring_step", "ring_uni"]

Pairs = tuple[tuple[int, int], ...]

_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")


def ring_pairs(members: Sequence[int], *, both_ways: bool = False) -> Pairs:
    """Each member to its successor (with wrap-around), and to its predecessor if ``both_ways``."""
    q = len(members)
    fwd = tuple((members[i], members[(i + 1) % q]) for i in range(q))
    if not both_ways:
        return fwd
    return fwd + tuple((members[i], members[i - 1]) for i in range(q))


def ring_step(rings: Sequence[Sequence[int]], nbytes: float, rounds: int) -> Step:
    """``rounds`` ring rounds on each of ``rings`` (all of one size q) at once.

    Each round moves ``nbytes / q`` per member: over both directions (half each)
    when q >= 3, over the successor alone when q == 2.
    """
    q = len(rings[0])
    both = q >= 3
    pairs = tuple(pair for members in rings for pair in ring_pairs(members, both_ways=both))
    return Step(pairs, nbytes / q / (2 if both else 1), rounds, pipelined=True)


def _rounds(op: str, p: int) -> int:
    return 2 * (p - 1) if op == "all_reduce" else p - 1


@register_algorithm("ring", ops=_OPS)
def ring(op: str, p: int, nbytes: float, info: GroupInfo) -> list[Step]:
    """Bidirectional ring: half the buffer each way round (see the module doc for costs)."""
    if p == 2:
        return ring_uni(op, p, nbytes, info)
    members = range(p)
    if op in ("broadcast", "reduce"):
        fwd = tuple((i, i + 1) for i in range(p - 1))
        bwd = ((0, p - 1), *((i, i - 1) for i in range(p - 1, 1, -1)))
        chains = fwd + bwd
        if op == "reduce":
            chains = tuple((b, a) for a, b in reversed(chains))
        return [Step(chains, nbytes / 2 / (p - 1), p - 1, pipelined=True)]
    return [ring_step([members], nbytes, _rounds(op, p))]


@register_algorithm("ring_uni", ops=_OPS)
def ring_uni(op: str, p: int, nbytes: float, info: GroupInfo) -> list[Step]:
    """One-direction ring: every rank sends to its successor (see the module doc for costs)."""
    del info
    if op in ("broadcast", "reduce"):
        chain = tuple((i, i + 1) for i in range(p - 1))
        if op == "reduce":
            chain = tuple((b, a) for a, b in reversed(chain))
        return [Step(chain, nbytes / (p - 1), p - 1, pipelined=True)]
    return [Step(ring_pairs(range(p)), nbytes / p, _rounds(op, p), pipelined=True)]
