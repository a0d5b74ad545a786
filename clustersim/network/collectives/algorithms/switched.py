"""NCCL's all-reduce algorithms besides the ring: its double binary tree, and NVLS.

``double_tree`` (NCCL's Tree): inside each node the ranks form a chain to a head
rank; across nodes the heads form two binary trees, the second the mirror image of
the first, so that a head inner in one tree is a leaf in the other. Each tree
carries half of its share of the ``n``-byte buffer, reduced up to the roots and
broadcast back down. NCCL splits each channel's threads between the two phases
(``runTreeSplit`` in ``NVIDIA/nccl:src/device/all_reduce.h``): a chunk goes down as
soon as the root has reduced it, while the next ones still go up, so both phases
stream at once, full duplex, and are simulated as one pipelined step whose chunks
travel the tree up and down (``2 (L - 1)`` hops inside, ``2 log2(nodes)`` across).
NCCL runs such trees on several channels, with the chain rotated so that every
rank of a node heads one and the traffic between nodes spreads over all of the
node's NICs: with ``L`` ranks per node there are ``L`` rotations, each with
``n / L`` of the buffer. Every chain edge then carries ``n`` each way up and ``n``
down, and a rank's link to the switch ``(L - 1) / L n`` in each phase, so with
``b`` seconds per byte an uncontended tree inside a node costs about ``2 n b``
plus its latency, half a ring's algorithm bandwidth, as NCCL's tuning model says.
On nodes of unequal sizes (a partly filled last NVL72 rack) there are as many
rotations as the smallest node has ranks (NCCL runs one channel count on every rank),
each with ``n / L_min`` of the buffer, and the longest chain sets the hops inside.
Across nodes a NIC carries, each way, a half-shard ``n / 2L`` per tree edge it
ends in, up and down: on two nodes 2 (``n / L``, the two trees' pair of sends
each way at once), at the root of a heap over three or four nodes 3, at an inner
node of a larger heap (a parent and two children in one tree, a parent in the
mirror) 4. Run one phase after the other, the root of a heap over four nodes
paid 4: its two children in one phase and its parent in the mirror tree's other.

``nvls`` (NVLink SHARP): the NVSwitch reduces what the ranks push into it and
multicasts the result, so each rank's link carries the buffer once each way,
``n b``, instead of a ring's ``2(p-1)/p n b``. It is simulated as one round in
which each rank sends ``n`` to its successor through the switch (each rank's up
and down link carry ``n``). It runs inside one scale-up domain with such a switch;
:class:`~clustersim.network.runtimes.nccl.NcclRuntime` only chooses it there.

``nvls_tree`` (NCCL's NVLS-tree, across nodes): the switch of each node reduces
the node's buffers (each rank's up link carries ``n``), the ``L`` ranks of a node
each own a ``1/L`` shard and all-reduce it over two mirrored binary trees of the
nodes (each tree half of the shard, reduced up and broadcast down), and the switch
multicasts the result (each rank's down link carries ``n``). NCCL pipelines the
three phases chunk by chunk, so it is simulated as one pipelined step: every flow
moves ``n / 2L``, the pairs inside a node repeated ``2L`` times, and the tree
edges across nodes once each (a rank's NIC carries ``n / L`` each way on two nodes).
NVLS's efficiency is the switch's, so NCCL's protocol for it caps the flows through
the switch at the rank's share of it (``Protocol.switch_Bps``) rather than adding
wire bytes to every flow, and the NICs run at their own rate: uncontended,
``t = latency + n max(1 / (B_nvlink e_nvls), c / (L B_nic))`` with ``c = 1`` on two
nodes (1.5 at the root of a heap over four, up to 2 beyond). The latency is NCCL's:
one NVLS hop and ``2 log2(nodes)`` network hops.

``ring_channels`` (NCCL's rings across nodes, for reduce-scatter and all-gather):
``L`` rings (channels) over the nodes in turn, the ``L`` ranks of each node in
the order rotated by ``k`` on channel ``k``, each ring carrying ``n / L`` one way
round. Every rank leaves its node on exactly one channel, so the traffic between
nodes spreads over every rank's NIC: a ring across nodes reaches ``L`` NICs'
bandwidth, not one's (nccl-tests: 46-48 GB/s busbw per 400 Gb/s NIC). On nodes of
unequal sizes (a partly filled last NVL72 rack) the channels are as many as the
smallest node has ranks (NCCL runs one channel count on every rank): each channel
enters and leaves every node by ranks of its own, so ``L = min`` NICs of each node
carry the traffic between nodes.
"""

from __future__ import annotations

import math
from functools import cache

from clustersim.network.collectives.groups import GroupInfo
from clustersim.network.collectives.registry import Step, register_algorithm

__all__ = ["double_tree", "nvls", "nvls_tree", "ring_channels", "tree_sends"]

Pairs = list[tuple[int, int]]


def _tree_up(leaders: list[int]) -> Pairs:
    """Child -> parent edges of a binary heap over ``leaders`` and of its mirror image."""
    n = len(leaders)
    first = [(leaders[i], leaders[(i - 1) // 2]) for i in range(1, n)]
    mirror = [(leaders[n - 1 - i], leaders[n - 1 - (i - 1) // 2]) for i in range(1, n)]
    return first + mirror


def _equal_domains(p: int, info: GroupInfo) -> bool:
    del p
    return len(set(info.domain_sizes())) == 1


@register_algorithm("double_tree", ops=("all_reduce",))
def double_tree(op: str, p: int, nbytes: float, info: GroupInfo) -> list[Step]:
    """A chain per node and two mirrored binary trees across nodes; see the module doc."""
    del op, p
    members = info.domain_members()
    width = min(len(m) for m in members)
    up: Pairs = []
    for k in range(width):
        heads = [m[k:] + m[:k] for m in members]
        chain = [(m[i + 1], m[i]) for m in heads for i in range(width - 1)]
        # Each tree moves half of the rotation's share; a chain edge carries both halves.
        up += chain + chain + _tree_up([m[0] for m in heads])
    half = nbytes / 2 / width
    hops = (2 * (max(len(m) for m in members) - 1), 2 * math.ceil(math.log2(len(members))))
    down = [(b, a) for a, b in reversed(up)]
    return [Step(tuple(up + down), half, pipelined=True, reduces=True, hops=hops)]


@cache
def tree_sends(nodes: int) -> int:
    """The most tree edges one node ends in over both mirrored trees across ``nodes``
    (parents and children): what its NIC carries each way, in half-shards, while the
    reduce and the broadcast stream at once."""
    ends = [0] * nodes
    for a, b in _tree_up(list(range(nodes))):
        ends[a] += 1
        ends[b] += 1
    return max(ends)


def _one_domain(p: int, info: GroupInfo) -> bool:
    del p
    return len(info.domain_sizes()) == 1


@register_algorithm("nvls", ops=("all_reduce",), applies=_one_domain)
def nvls(op: str, p: int, nbytes: float, info: GroupInfo) -> list[Step]:
    """In-switch reduction and multicast: the buffer once each way; see the module doc."""
    del op, info
    return [Step(tuple((i, (i + 1) % p) for i in range(p)), nbytes)]


def _several_equal_domains(p: int, info: GroupInfo) -> bool:
    return _equal_domains(p, info) and len(info.domain_sizes()) > 1


@register_algorithm("nvls_tree", ops=("all_reduce",), applies=_several_equal_domains)
def nvls_tree(op: str, p: int, nbytes: float, info: GroupInfo) -> list[Step]:
    """In-switch reduction in each node, trees of shards across nodes; see the module doc."""
    del op, p
    members = info.domain_members()
    width = len(members[0])
    inside = [(m[i], m[(i + 1) % width]) for m in members for i in range(width)]
    up: Pairs = []
    for k in range(width):
        up += _tree_up([m[k] for m in members])
    across = up + [(b, a) for a, b in up]
    pairs = tuple(inside * (2 * width) + across)
    hops = (1, 2 * math.ceil(math.log2(len(members))))
    return [Step(pairs, nbytes / 2 / width, pipelined=True, reduces=True, hops=hops)]


def _several_domains_of_several(p: int, info: GroupInfo) -> bool:
    sizes = info.domain_sizes()
    return len(sizes) > 1 and min(sizes) > 1


@register_algorithm(
    "ring_channels", ops=("reduce_scatter", "all_gather"), applies=_several_domains_of_several
)
def ring_channels(op: str, p: int, nbytes: float, info: GroupInfo) -> list[Step]:
    """One ring per rank of the smallest node, rotated inside each node; see the module doc."""
    del op
    members = info.domain_members()
    width = min(len(m) for m in members)
    pairs: Pairs = []
    for k in range(width):
        order = [r for m in members for r in m[k:] + m[:k]]
        pairs += [(order[i], order[(i + 1) % p]) for i in range(p)]
    return [Step(tuple(pairs), nbytes / width / p, p - 1, pipelined=True)]
