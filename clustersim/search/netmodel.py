"""The cluster's links as the search's estimate sees them, and one collective's time.

:class:`NetModel` cuts a group of ranks into levels (the ranks of one chip, the
chips of an instance along each torus axis, the instances of an UltraServer, the
scale-up domains over EFA), and :func:`collective_s` adds up the alpha-beta cost of
each level with what the communication runtime adds, as the simulator adds it
(:mod:`clustersim.network.runtimes.costs`, :mod:`clustersim.network.runtimes.nccl`); see
:mod:`clustersim.search.estimate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter

from clustersim.catalog.schema import ChipSpec, InstanceSpec
from clustersim.network.collectives import (
    HALVING_DOUBLING_MAX_BYTES,
    MESH_MAX_BYTES,
    GroupInfo,
    tree_sends,
)
from clustersim.network.fabric import local_path, torus_domain_coords
from clustersim.network.runtimes import NO_COSTS, NcclRuntime, Protocol, Runtime, runtime_of
from clustersim.search.experts import all_to_all_cost_s
from clustersim.search.flatring import FlatRing, TorusDomain, flat_ring, flat_ring_s

__all__ = ["TORUS", "Level", "NetModel", "collective_s", "collective_wire_s", "runtime_s", "wire_s"]

TORUS = ("torus2d", "torus3d")


@dataclass(frozen=True)
class Level:
    """One level of a group: ``size`` members, each chip's bandwidth and the hop latency.

    ``bw_Bps`` is one direction of one chip's link at this level; ``bidirectional``
    rings of three or more use both directions. ``shared_link`` marks the chip's
    own DMA link, which every rank of the chip shares in both directions. Members
    ``hop`` links apart share each link with the groups interleaved between them.
    """

    size: int
    bw_Bps: float
    latency_s: float
    bidirectional: bool = False
    shared_link: bool = False
    hop: int = 1  # torus links between neighbouring members (their chip stride on this axis)
    tier: str = ""  # which links: chip (DMA), x or y (a torus axis), fabric, domain, efa


@dataclass(frozen=True)
class NetModel:
    """The bandwidth tiers of a cluster, from its instance and chip catalog entries."""

    ranks_per_chip: int
    chips_per_instance: int
    instances_per_domain: int
    instances: int
    dma_Bps: float
    fabric_topology: str
    fabric_dims: tuple[int, ...]
    fabric_Bps: float
    fabric_latency_s: float
    domain_topology: str
    domain_Bps: float
    domain_latency_s: float
    efa_Bps: float
    efa_latency_s: float
    runtime: Runtime = NO_COSTS
    """The communication runtime, whose fixed costs :func:`runtime_s` adds."""
    torus: TorusDomain | None = None
    """A torus domain's placement and links, where groups that are no grid run a flat
    ring (:mod:`~clustersim.search.flatring`)."""

    @classmethod
    def of(cls, instance: InstanceSpec, chip: ChipSpec, count: int, lnc: int) -> NetModel:
        eff = chip.calibration.link_efficiency
        fab, us = instance.fabric, instance.ultraserver
        switch_hops = 1 if fab.topology in TORUS else 2  # chip -> switch -> chip
        placed = torus_domain_coords(instance)
        torus = None
        if placed is not None:
            coords, dims = placed
            axes = len(dims)
            z = [us.link_bw_Bps * eff] if us is not None and axes == 3 else []
            z_s = [us.link_latency_s] if us is not None and axes == 3 else []
            torus = TorusDomain(
                tuple(coords),
                dims,
                (fab.link_bw_Bps * eff, fab.link_bw_Bps * eff, *z),
                (fab.link_latency_s, fab.link_latency_s, *z_s),
                chip.cores // lnc,
            )
        return cls(
            ranks_per_chip=chip.cores // lnc,
            chips_per_instance=instance.chips,
            instances_per_domain=us.instances if us is not None else 1,
            instances=count,
            dma_Bps=local_path(chip)[0],
            fabric_topology=fab.topology,
            fabric_dims=tuple(fab.dims),
            fabric_Bps=fab.link_bw_Bps * eff,
            fabric_latency_s=fab.link_latency_s * switch_hops,
            domain_topology=us.topology if us is not None else "",
            domain_Bps=us.link_bw_Bps * eff if us is not None else 0.0,
            domain_latency_s=(us.link_latency_s * (1 if us.topology in TORUS else 2))
            if us is not None
            else 0.0,
            efa_Bps=instance.efa.bandwidth_Bps / instance.chips * chip.efa_link_efficiency,
            efa_latency_s=instance.efa.latency_s,
            runtime=runtime_of(chip, instance, in_program=True),
            torus=torus,
        )

    def flat_ring(self, stride: int, size: int, op: str, nbytes: float) -> FlatRing | None:
        """The flat ring the runtime runs ``op`` of ``nbytes`` on over a group of ``size``
        ranks ``stride`` apart, or None when it runs something else."""
        if self.torus is None or op not in _RING_OPS or isinstance(self.runtime, NcclRuntime):
            return None
        ring = flat_ring(self.torus, stride, size)
        if ring is None or self.runtime.choose(op, ring.p, nbytes, ring.info, "auto")[0] != "ring":
            return None
        return ring

    def flat_ring_s(self, ring: FlatRing, op: str, nbytes: float) -> tuple[float, float]:
        """(all of it, seconds on the links) of ``op`` on the flat ``ring``."""
        proto = self.runtime.choose(op, ring.p, nbytes, ring.info, "auto")[1]
        return flat_ring_s(
            op,
            nbytes,
            ring,
            launch_s=proto.launch_s,
            step_s=proto.ring_handshake_s,
            message_s=proto.message_s,
        )

    def levels(self, stride: int, size: int) -> tuple[list[Level], int]:
        """The levels of a group of ``size`` ranks ``stride`` apart, and the groups per chip.

        Ranks fill chips in order, chips fill instances, instances fill domains.
        """
        rpc, cpi = self.ranks_per_chip, self.chips_per_instance
        per_chip = min(size, max(1, rpc // stride)) if stride < rpc else 1
        sharing = max(1, rpc // per_chip)  # groups of this kind with a member on each chip
        out: list[Level] = []
        if per_chip > 1:
            out.append(Level(per_chip, self.dma_Bps, 0.0, shared_link=True, tier="chip"))
        chips = size // per_chip
        chip_stride = max(1, stride * per_chip // rpc)
        in_instance = min(chips, max(1, cpi // chip_stride)) if chip_stride < cpi else 1
        if in_instance > 1:
            torus = self.fabric_topology in TORUS
            if torus and len(self.fabric_dims) >= 2:
                # Chips fill the torus along x first: the group's chips form lines
                # along x (chip_stride apart) and then along y.
                row = self.fabric_dims[0]
                x = min(in_instance, row // chip_stride) if chip_stride < row else 1
                hops = (chip_stride, 1) if chip_stride < row else (1, chip_stride // row)
                sizes = (x, in_instance // x)
                axes = [
                    (a, h, name)
                    for a, h, name in zip(sizes, hops, ("x", "y"), strict=True)
                    if a > 1
                ]
            else:
                axes = [(in_instance, 1, "fabric")]
            for d, hop, name in axes:
                out.append(
                    Level(
                        d,
                        self.fabric_Bps,
                        self.fabric_latency_s,
                        bidirectional=torus,
                        hop=hop,
                        tier=name,
                    )
                )
        rest = chips // in_instance
        inst_stride = max(1, chip_stride * in_instance // cpi)
        upd = self.instances_per_domain
        in_domain = min(rest, max(1, upd // inst_stride)) if inst_stride < upd else 1
        if in_domain > 1:
            torus = self.domain_topology in TORUS
            out.append(
                Level(
                    in_domain,
                    self.domain_Bps,
                    self.domain_latency_s,
                    bidirectional=torus,
                    tier="domain",
                )
            )
        domains = rest // in_domain
        if domains > 1:
            out.append(Level(domains, self.efa_Bps, self.efa_latency_s, tier="efa"))
        return out, sharing


def collective_s(
    op: str, nbytes: float, levels: list[Level], sharing: int, runtime: Runtime = NO_COSTS
) -> float:
    """Alpha-beta time of one collective over ``levels`` (inner first), plus what the
    ``runtime`` adds (:func:`runtime_s`); see the module doc."""
    p = math.prod(lv.size for lv in levels)
    if p <= 1 or nbytes <= 0:
        return 0.0
    if op == "all_to_all":
        flows = sharing * (levels[0].size if levels[0].shared_link else 1)
        nodes = math.prod(lv.size for lv in levels if lv.tier == "efa")
        return all_to_all_cost_s(nbytes, levels, flows, p, nodes=nodes, runtime=runtime)
    if isinstance(runtime, NcclRuntime):
        return _nccl_s(op, nbytes, levels, sharing, runtime)
    proto = runtime.choose(op, p, nbytes, GroupInfo.flat(p), "auto")[1]
    phases = 2 if op == "all_reduce" else 1
    return (
        phases * _latency_s(nbytes, levels)
        + wire_s(op, nbytes, levels, sharing, proto)
        + runtime_s(proto, nbytes, levels, phases)
    )


def _kinds(nbytes: float, levels: list[Level]) -> list[str]:
    """The algorithm of each level (``mesh``, ``halving`` or ``ring``), by the Neuron
    runtime's size rule (:func:`~clustersim.network.collectives.registry.choose`). A group over
    several domains with more than one rank in each runs ``hierarchical``: a ring from
    1 MB up inside the domains, and the rule on the shard across them
    (:func:`~clustersim.network.collectives.algorithms.hierarchical.phase_algorithm`)."""
    inner = [lv for lv in levels if lv.tier != "efa"]
    local = math.prod(lv.size for lv in inner)
    domains = math.prod(lv.size for lv in levels if lv.tier == "efa")

    def rule(m: float, q: int, *, inside: bool) -> str:
        if m < MESH_MAX_BYTES:
            return "mesh"
        if not inside and m <= HALVING_DOUBLING_MAX_BYTES and q & (q - 1) == 0:
            return "halving"
        return "ring"

    if domains > 1 and local > 1:
        shard = rule(nbytes / local, domains, inside=False)
        return [shard if lv.tier == "efa" else rule(nbytes, local, inside=True) for lv in levels]
    one = rule(nbytes, local * domains, inside=False)
    return [one] * len(levels)


def _latency_s(nbytes: float, levels: list[Level]) -> float:
    """The route latencies of one phase, by the runtime's size rule: a mesh round over
    the levels it spans, ``log2`` rounds of halving-doubling, a ring's rounds."""
    out = 0.0
    for kind, run in groupby(zip(_kinds(nbytes, levels), levels, strict=True), key=itemgetter(0)):
        lvs = [lv for _, lv in run]
        longest = max(lv.latency_s for lv in lvs)
        if kind == "mesh":
            out += longest
        elif kind == "halving":
            out += math.log2(math.prod(lv.size for lv in lvs)) * longest
        else:
            out += sum((lv.size - 1) * lv.latency_s for lv in lvs)
    return out


def wire_s(
    op: str,
    nbytes: float,
    levels: list[Level],
    sharing: int,
    proto: Protocol,
    *,
    together: int = 1,
) -> float:
    """The bandwidth part: every phase's bytes over each level's bottleneck, with
    ``together`` such collectives on the same links at once (a halving-doubling
    message bound by its DMA queues leaves the links room for another's)."""
    flows = sharing * (levels[0].size if levels[0].shared_link else 1)
    kinds = _kinds(nbytes, levels)
    phases = {"all_reduce": ("reduce", "copy"), "all_gather": ("copy",)}.get(op, ("reduce",))
    bw_s = 0.0
    for phase in phases:
        cap = proto.message_cap_Bps(pipelined=False, reduces=phase == "reduce")
        m = nbytes
        for lv, kind in zip(levels, kinds, strict=True):
            d = lv.size
            if kind == "halving" and d & (d - 1) == 0:
                # Round j swaps m / 2^(j+1) with the partner 2^j away; on a torus that
                # partner is min(2^j, d - 2^j) hops off, and the hops load one direction.
                # Half way round (2^j = d/2) the chips at even coordinates go one way
                # and the odd ones the other, so a link direction carries the ties of
                # the d x hop / 4 chips before it on one parity, not d x hop / 2.
                # Each message moves no faster than the DMA queues that carry it.
                for j in range(d.bit_length() - 1):
                    hops = min(2**j, d - 2**j) * lv.hop if lv.bidirectional else 1
                    if lv.bidirectional and 2 ** (j + 1) == d:
                        hops = math.ceil(d * lv.hop / 4)
                    sent = m / 2 ** (j + 1)
                    bw_s += max(sent * hops * flows * together / lv.bw_Bps, sent / cap)
            else:
                # Members hop links apart share each link with the groups interleaved
                # between them; a pair too, whose route takes one of the two ways
                # round the axis (the fabric's shortest path), not both.
                load = lv.hop
                link = lv.bw_Bps * (2 if lv.bidirectional and d >= 3 else 1)
                bw_s += (d - 1) / d * m * flows * together * load / link
            m /= d
    return bw_s


def runtime_s(proto: Protocol, nbytes: float, levels: list[Level], phases: int) -> float:
    """The Neuron runtime's fixed costs of one collective
    (:mod:`~clustersim.network.runtimes.costs`): its launch, and per phase a handshake per
    round (one for a mesh, ``log2`` for halving-doubling, a ring's own per step: in a
    hierarchical collective one ring through the ranks of each domain), the messages each
    round posts (a mesh's one per peer, a ring's one each way) and a posting cost per round
    that crosses EFA."""
    if proto.zero:
        return 0.0
    kinds = _kinds(nbytes, levels)
    spans = [lv for lv in levels if lv.size > 1]
    inner = [lv for lv in spans if lv.tier != "efa"]
    if inner and len(inner) < len(spans):  # hierarchical: a phase inside, one across
        local = math.prod(lv.size for lv in inner)
        parts = [(kinds[levels.index(inner[0])], local, False)]
        parts += [(kinds[levels.index(lv)], lv.size, True) for lv in spans if lv.tier == "efa"]
    elif kinds and kinds[0] == "mesh":
        p = math.prod(lv.size for lv in levels)
        parts = [("mesh", p, any(lv.tier == "efa" for lv in spans))]
    else:
        parts = [(kind, lv.size, lv.tier == "efa") for lv, kind in zip(levels, kinds, strict=True)]
    fixed = efa_rounds = 0.0
    for kind, size, efa in parts:
        if size < 2:
            continue
        if kind == "mesh":
            rounds, hand, messages = 1.0, proto.step_s, size - 1
        elif kind == "halving":
            rounds, hand, messages = math.log2(size), proto.step_s, 1
        else:
            rounds, hand, messages = size - 1.0, proto.ring_handshake_s, 2 if size >= 3 else 1
        fixed += rounds * (hand + messages * proto.message_s)
        if efa:
            efa_rounds += rounds
    return proto.launch_s + phases * (fixed + efa_rounds * proto.efa_message_s)


def _nccl_s(
    op: str, nbytes: float, levels: list[Level], sharing: int, runtime: NcclRuntime
) -> float:
    """NCCL's choice and its latency (its tuning model), over the levels' bandwidths."""
    return sum(_nccl_parts(op, nbytes, levels, sharing, runtime))


def _nccl_parts(
    op: str, nbytes: float, levels: list[Level], sharing: int, runtime: NcclRuntime
) -> tuple[float, float]:
    """(latency, seconds on the links) of NCCL's choice for one collective."""
    p = math.prod(lv.size for lv in levels)
    nodes = math.prod(lv.size for lv in levels if lv.tier == "efa")
    info = GroupInfo(tuple(range(p)), tuple(i * nodes // p for i in range(p)), (), ())
    algo, proto = runtime.choose(op, p, nbytes, info, "auto")
    latency = runtime.predict_s(op, p, 0.0, info, (algo, proto.name))
    if algo in ("ring", "ring_channels") and op in _RING_OPS and nodes > 1:
        latency = _flat_ring_latency_s(op, p, nodes, proto, runtime.net_latency_s)
    flows = sharing * (levels[0].size if levels[0].shared_link else 1)
    if algo == "nvls":
        wire = nbytes * flows / levels[0].bw_Bps  # the protocol's factor holds its efficiency
    elif algo == "double_tree":
        wire = _double_tree_wire_s(nbytes, levels, flows)
    elif algo in ("sharp", "nvls_sharp"):
        wire = _in_network_wire_s(algo, nbytes, levels, flows, runtime)
    elif algo == "ring_channels":
        wire = _channel_ring_wire_s(op, nbytes, levels, flows)
    elif op in _RING_OPS and len(levels) > 1:
        wire = _flat_ring_wire_s(op, nbytes, levels, flows)
    else:
        wire = wire_s(op, nbytes, levels, sharing, Protocol())
    return latency, wire * proto.wire_factor


_RING_OPS = ("all_reduce", "reduce_scatter", "all_gather")


def _in_network_wire_s(
    algo: str, nbytes: float, levels: list[Level], flows: int, runtime: NcclRuntime
) -> float:
    """An all-reduce reduced in the scale-out switches, as the simulator runs it
    (:mod:`~clustersim.network.collectives.algorithms.innetwork`): each node's NICs carry
    the buffer once each way, and inside a node NVLS's switch ``n`` per rank or the
    direct phases ``2 (L - 1) / L n``."""
    inner = [lv for lv in levels if lv.tier != "efa"]
    across = [lv for lv in levels if lv.tier == "efa"]
    width = math.prod(lv.size for lv in inner)
    nic_s = nbytes / width * flows / across[0].bw_Bps if across else 0.0
    if width == 1:
        return nic_s
    bw = min(lv.bw_Bps for lv in inner)
    if algo == "nvls_sharp":
        inside_s = nbytes * flows / (bw * runtime.nvls_efficiency)
    else:
        inside_s = 2 * (width - 1) / width * nbytes * flows / bw
    return max(inside_s, nic_s)


def _flat_ring_wire_s(op: str, nbytes: float, levels: list[Level], flows: int) -> float:
    """NCCL's ring as the simulator runs it
    (:mod:`~clustersim.network.collectives.algorithms.ring`): one ring through every member
    in group order, not reduced level by level, half the buffer each way round. Each of its
    ``p - 1`` rounds (twice for all-reduce) moves ``n / p`` per member: a member with both
    neighbours across a level's links (the innermost level of three or more) sends both
    halves on its link there, one at a block's edge sends one half across the level its
    neighbour is behind."""
    p = math.prod(lv.size for lv in levels)
    rounds = 2 * (p - 1) if op == "all_reduce" else p - 1
    inner = levels[0]
    round_s = max(
        (nbytes / p if inner.size >= 3 else nbytes / p / 2) * flows / inner.bw_Bps,
        *(nbytes / p / 2 * flows / lv.bw_Bps for lv in levels[1:]),
    )
    return rounds * round_s


def _channel_ring_wire_s(op: str, nbytes: float, levels: list[Level], flows: int) -> float:
    """NCCL's rings across nodes as the simulator runs them (``ring_channels`` in
    :mod:`~clustersim.network.collectives.algorithms.switched`): a ring per rank of a node,
    each with ``n / L`` one way round; in each of the ``p - 1`` rounds a rank sends ``n / (L p)`` on
    ``L - 1`` rings inside its node and on one across."""
    p = math.prod(lv.size for lv in levels)
    rounds = 2 * (p - 1) if op == "all_reduce" else p - 1
    width = levels[0].size
    per_flow = nbytes / width / p * flows
    across = min(lv.bw_Bps for lv in levels[1:])
    return rounds * per_flow * max((width - 1) / levels[0].bw_Bps, 1 / across)


def _flat_ring_latency_s(op: str, p: int, nodes: int, proto: Protocol, net_s: float) -> float:
    """The flat ring's latency as the flow model charges it
    (:mod:`~clustersim.network.runtimes.costs`): every round pays the hop of its pairs'
    mix, ``f`` of them crossing nodes (the ring crosses each of the ``nodes`` boundaries
    both ways), where NCCL's tuning model counts ``nodes - 1`` network hops per phase."""
    rounds = 2 * (p - 1) if op == "all_reduce" else p - 1
    f = nodes / p if p >= 3 else 1.0
    hop = (1 - f) * proto.step_s + f * (proto.net_step_s + proto.route_inter * net_s)
    return proto.launch_s + rounds * hop


def _double_tree_wire_s(nbytes: float, levels: list[Level], flows: int) -> float:
    """NCCL's double binary tree as the simulator runs it
    (:mod:`~clustersim.network.collectives.algorithms.switched`), the reduce and the broadcast at
    once: the chain of the ``L`` ranks of a node (every rank but the rotation's head
    sends its share on it in each phase, ``2 (L - 1) / L n``), and the trees across
    nodes, where each rank heads one of ``L`` rotations of ``n / L`` and its NIC carries
    a half of it per tree edge its node ends in (:func:`tree_sends`)."""
    intra = [lv for lv in levels if lv.tier != "efa"]
    nodes = math.prod(lv.size for lv in levels if lv.tier == "efa")
    width = math.prod(lv.size for lv in intra)
    chain = (width - 1) / width * nbytes * flows / min(lv.bw_Bps for lv in intra) if intra else 0.0
    across = 0.0
    if nodes > 1:
        efa = min(lv.bw_Bps for lv in levels if lv.tier == "efa")
        across = nbytes / width / 2 * tree_sends(nodes) * flows / efa
    return max(2 * chain, across)


def collective_wire_s(
    op: str,
    nbytes: float,
    levels: list[Level],
    sharing: int,
    runtime: Runtime = NO_COSTS,
    *,
    together: int = 1,
) -> float:
    """The part of :func:`collective_s` the bytes spend on the links, which is what
    another collective on those links slows (the runtime's fixed costs hold no link);
    with ``together`` > 1, what one more on the same links at once adds to it (on
    Trainium less, where DMA queues bound the messages; NCCL's all of it)."""
    p = math.prod(lv.size for lv in levels) if levels else 1
    if p <= 1 or nbytes <= 0:
        return 0.0
    if isinstance(runtime, NcclRuntime):
        return _nccl_parts(op, nbytes, levels, sharing, runtime)[1]
    proto = runtime.choose(op, p, nbytes, GroupInfo.flat(p), "auto")[1]
    alone = wire_s(op, nbytes, levels, sharing, proto)
    if together == 1:
        return alone
    return (wire_s(op, nbytes, levels, sharing, proto, together=together) - alone) / (together - 1)
