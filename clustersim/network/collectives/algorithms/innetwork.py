"""All-reduce reduced in the scale-out switches: NCCL's CollNet (InfiniBand SHARP).

With SHARP the InfiniBand switches add up what the nodes send them and send the sum
back: each NIC sends its share of the buffer once up the aggregation tree and
receives the result once, where a ring sends it twice (``2 (p - 1) / p``), so an
in-network all-reduce moves half a ring's bytes per NIC. Both algorithms run on a
group over several scale-up domains (nodes) with the same number ``L`` of ranks in
each; rank ``k`` of each node owns a ``1/L`` shard and sends it through its own NIC
(its rail).

``sharp`` (NCCL's CollNet Direct): the ranks of a node reduce-scatter the buffer
among themselves (each sends ``n / L`` to each of its ``L - 1`` peers), each
all-reduces its shard through the switches, and they all-gather the result (``n /
L`` to each peer again). Each rank's scale-up link carries ``2 (L - 1) / L n`` each
way and its NIC ``n / L``. With one rank per node (a data-parallel group of
tensor-parallel ranks) only the switches' part is left: the NIC carries ``n`` each
way, against a ring's ``2 (p - 1) / p n``.

``nvls_sharp`` (NCCL's NVLS across nodes, NVLink SHARP inside and IB SHARP across):
the NVSwitch reduces each node's buffers (each rank's link to it carries ``n`` up),
each rank sends its reduced shard through its NIC to the switches and gets the sum
back, and the NVSwitch multicasts it (``n`` down each rank's link). It needs
``L > 1`` and a scale-up switch that reduces (``collectives.nvls``).

NCCL pipelines the phases chunk by chunk, so each is simulated as one pipelined step
in which every flow moves ``n / L``: the pairs inside a node repeated to carry their
phase's bytes (``nvls_sharp``: a ring through the switch ``L`` times, ``n`` each way
per rank; ``sharp``: every ordered pair twice), and across nodes a ring over the
ranks of equal position, one flow each, which loads every NIC with ``n / L`` up and
``n / L`` down, as the aggregation tree does (the reduction itself happens in the
switches, which the flows do not model). Uncontended, with per-rank bandwidths
``B`` inside the node and ``B_nic`` across:

    sharp:      t = latency + n max(2 (L - 1) / (L B), 1 / (L B_nic))
    nvls_sharp: t = latency + n max(1 / (B e_nvls), 1 / (L B_nic))

where ``e_nvls`` is the switch's efficiency (``collectives.nvls_efficiency``, applied
by NCCL's protocol as for NVLS-tree). The latency is one network traversal of the
tree and the NVLink phases' hops (NCCL's tuning model: NVLS across nodes costs its
NVLink hop and one network hop, ``catalog/runtimes.yaml``).

Reduce-scatter and all-gather keep their rings: in the switches a reduce-scatter
still sends the whole buffer up each NIC (``n`` against a ring's ``(p - 1) / p n``)
and an all-gather receives it all, so the bytes per NIC do not fall, and the sources
document in-network reduction for all-reduce only.
"""

from __future__ import annotations

from clustersim.network.collectives.groups import GroupInfo
from clustersim.network.collectives.registry import Step, register_algorithm

__all__ = ["nvls_sharp", "sharp"]

Pairs = list[tuple[int, int]]


def _equal_nodes(p: int, info: GroupInfo) -> bool:
    del p
    sizes = info.domain_sizes()
    return len(sizes) > 1 and len(set(sizes)) == 1


def _equal_nodes_of_several(p: int, info: GroupInfo) -> bool:
    return _equal_nodes(p, info) and info.domain_sizes()[0] > 1


def _across(members: list[list[int]]) -> Pairs:
    """Rank ``k`` of each node to rank ``k`` of the next: every NIC one flow up, one down."""
    nodes, width = len(members), len(members[0])
    nxt = [members[(d + 1) % nodes] for d in range(nodes)]
    return [(members[d][k], nxt[d][k]) for k in range(width) for d in range(nodes)]


@register_algorithm("sharp", ops=("all_reduce",), applies=_equal_nodes)
def sharp(op: str, p: int, nbytes: float, info: GroupInfo) -> list[Step]:
    """Direct reduce-scatter in each node, shards reduced in the switches, direct
    all-gather; see the module doc."""
    del op, p
    members = info.domain_members()
    width = len(members[0])
    inside = [(a, b) for m in members for a in m for b in m if a != b]
    pairs = tuple(inside * 2 + _across(members))
    hops = (2 if width > 1 else 0, 1)
    return [Step(pairs, nbytes / width, pipelined=True, reduces=True, hops=hops)]


@register_algorithm("nvls_sharp", ops=("all_reduce",), applies=_equal_nodes_of_several)
def nvls_sharp(op: str, p: int, nbytes: float, info: GroupInfo) -> list[Step]:
    """NVSwitch reduction in each node, shards reduced in the IB switches, NVSwitch
    multicast; see the module doc."""
    del op, p
    members = info.domain_members()
    width = len(members[0])
    inside = [(m[i], m[(i + 1) % width]) for m in members for i in range(width)]
    pairs = tuple(inside * width + _across(members))
    return [Step(pairs, nbytes / width, pipelined=True, reduces=True, hops=(1, 1))]
