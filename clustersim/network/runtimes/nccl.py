"""NCCL's choice of algorithm and protocol, from its tuning model.

NCCL does not follow the Neuron runtime's size rule. For each collective,
algorithm (``ring``, ``double_tree``, ``nvls``) and protocol (LL, LL128, Simple) it
predicts ``time = latency + size / bandwidth`` and runs the fastest
(``NVIDIA/nccl:src/graph/tuning.cc``; the tables are data, ``catalog/runtimes.yaml``).
:class:`NcclRuntime` does the same, then the flow model simulates the chosen
algorithm's flows with the protocol's costs (:class:`~.costs.Protocol`): its base
latency once, a hop latency per step (the network hop, the post overhead and the
route's latency on steps that cross nodes, twice for Simple), and its wire
overhead on the bytes.

The model's inputs are the group's shape (ranks, nodes, ranks per node) and one
rank's bandwidth inside its node and across (``intra_Bps``, ``inter_Bps``):

- latency: ring ``base + (steps - s_net) x intra_hop + s_net x net_hop`` with
  ``steps = 2(p - 1)`` for all-reduce (``p - 1`` otherwise) and ``s_net`` the steps
  that cross nodes; tree ``base + 2((ppn - 1) x intra_hop + log2(nodes) x net_hop)``;
  NVLS its hop alone;
- bandwidth: the intra-node one on one node, the smaller one across nodes, times the
  protocol's factor (NVLS-tree: the smaller of the switch's share of NVLink, NVLS's
  efficiency, and the node's NICs, halved beyond two nodes); bus to algorithm
  bandwidth: ring by the collective's busbw factor, tree x 0.5, NVLS x 5/6.

Across nodes NCCL's tuning is offered LL and Simple only (``network_protocols``):
NCCL does not run LL128 over EFA by default. NVLS runs only on one node of chips
whose ``collectives.nvls`` says their NVSwitch reduces in the network; NVLS-tree
(``nvls_tree``, NVLS inside each node and trees across) runs across nodes when it
is asked for, and ``auto`` never picks it. nccl-tests on 2 x p5.48xlarge ran tree
Simple at 8 MiB and 128 MiB (the simulated tree is within 0.5% of both) and reduced
in the switch from 1 GiB up (the measured busbw is more than a chain tree carries
over NVLink). NCCL's tuning model cannot give that order: on two nodes of 8 its
tables put NVLS-tree's latency 39.4 us below tree Simple's (8.4 + 2 x 7 x 4.0 - 25;
both cross the network 2 log2(nodes) times), so with ``time = latency + size /
bandwidth`` a size at which NVLS-tree wins makes it win at every smaller size,
whatever the channel counts, per-channel bandwidths and caps. The switch comes from
outside the built-in model (NCCL also takes a tuner plugin; which one the benchmark
ran is not published). Offered to ``auto``, NVLS-tree wins from about 4 MB and runs
8 MiB and 128 MiB 25-30% faster than measured.
Reduce-scatter and all-gather rings across nodes run one channel per rank of a
node (``ring_channels``; of the smallest node where they differ), so the tuning prices
them at those NICs together.
On an InfiniBand fabric whose switches reduce (``efa.sharp``: SHARP, with NCCL's
CollNet on) an all-reduce across nodes may also run ``sharp`` (CollNet) or, with
NVLS, ``nvls_sharp`` (NVLS across nodes), priced as their flows run (the node's NICs
carry the buffer once each way; :mod:`~clustersim.network.collectives.algorithms.innetwork`)
with NCCL's NVLS latency: one NVLink hop and one network hop.
An all-to-all whose group spans nodes runs as NCCL runs torch's ``all_to_all_single``:
a send and a receive per peer posted as one group (ncclGroupStart/End), which NCCL
schedules as rounds of (send to rank + d, receive from rank - d) but whose kernel runs
many peers at once on its channels, so the flow model moves every pair in one step
(``mesh``). It pays NCCL's base latency once, one network hop with its post overhead
and the route's latency, and the proxy's posting: each rank's proxy thread posts a
message per chunk (``NCCL_P2P_NET_CHUNKSIZE``) of every block bound for another node to
the network plugin, one after another, while earlier messages are on the wire, so the
step lasts the slower of the posting and the wire (a bound on every flow's rate,
:meth:`NcclRuntime.grouped_protocol`). Sends of up to 16 KiB run LL, larger ones Simple.
With PXN (on by default) a message to a remote GPU leaves by the NIC of the local GPU on
the destination's rail; in a balanced all-to-all every NIC still carries one GPU's share
of the traffic that crosses nodes, which the flow model's routes (each GPU's own NIC)
give too. Inside one node ``auto`` keeps ``pairwise``, NCCL's rounds priced with the
ring's NVLink hop each (unmeasured here); an explicit ``pairwise`` runs its rounds on any
group. The chunk size, the posting cost and the LL threshold are
``catalog/runtimes.yaml``'s ``p2p`` block (the posting cost has no measurement).
Not modelled: NCCL's per-channel bandwidth caps and channel counts (they cannot
move the turn to NVLS-tree, above), CollNet's own tuning rows (not in the sources:
``catalog/runtimes.yaml`` says what stands in for them) and PAT.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources

from pydantic import Field

from clustersim.catalog.schema import ChipSpec, Strict
from clustersim.catalog.shipped import load_yaml
from clustersim.errors import ScenarioError
from clustersim.network.collectives import GroupInfo, busbw_factor
from clustersim.network.runtimes.costs import Protocol

__all__ = ["PROTOCOLS", "NcclP2p", "NcclRuntime", "NcclTables", "nccl_tables"]

PROTOCOLS: tuple[str, ...] = ("LL", "LL128", "Simple")

_ALGORITHMS: dict[str, tuple[str, ...]] = {
    # op -> the NCCL algorithms that implement it, by clustersim's names
    "all_reduce": ("ring", "double_tree", "nvls", "sharp", "nvls_sharp"),
    "reduce_scatter": ("ring",),
    "all_gather": ("ring",),
    "broadcast": ("ring",),
    "reduce": ("ring",),
    "all_to_all": ("pairwise",),
    # no algorithm of NCCL's own: torch.distributed posts the root's sends and receives
    # as one group, as NCCL's all-to-all does
    "gather": ("mesh",),
    "scatter": ("mesh",),
}
_TABLE = {
    "ring": "ring",
    "double_tree": "tree",
    "nvls": "nvls",
    "nvls_tree": "nvls_tree",
    "sharp": "collnet",
    "nvls_sharp": "nvls",
    "ring_channels": "ring",
    "pairwise": "ring",
    "mesh": "ring",
}
"""Which row of NCCL's tables prices each algorithm (all-to-all is point-to-point)."""
_CHANNEL_OPS = ("reduce_scatter", "all_gather")
"""Ops whose rings across nodes run a channel per rank of a node (``ring_channels``)."""
_IN_NETWORK = ("sharp", "nvls_sharp")
"""Algorithms that reduce in the scale-out switches (InfiniBand SHARP: NCCL's CollNet)."""


class NcclP2p(Strict):
    """How NCCL moves a group of sends and receives across nodes (``catalog/runtimes.yaml``)."""

    chunk_bytes: float = Field(gt=0)
    """The most bytes one network message carries (``NCCL_P2P_NET_CHUNKSIZE``)."""
    message_us: float = Field(ge=0)
    """The proxy's cost to post one message to the network plugin, serial per GPU."""
    ll_threshold_bytes: float = Field(ge=0)
    """Sends of at most this many bytes run LL, larger ones Simple (``NCCL_P2P_LL_THRESHOLD``)."""


class NcclTables(Strict):
    """NCCL's tuning tables (microseconds; factors), from ``catalog/runtimes.yaml``."""

    base_us: dict[str, dict[str, float]]
    intra_hop_us: dict[str, dict[str, float]]
    net_hop_us: dict[str, dict[str, float]]
    net_post_us: float = Field(ge=0)
    network_protocols: tuple[str, ...]
    """The protocols NCCL runs by default on a group that spans nodes (over EFA)."""
    bandwidth_factor: dict[str, dict[str, float]]
    bus_to_alg: dict[str, float]
    p2p: NcclP2p
    sources: dict[str, str]


def _grouped(op: str, algo: str, info: GroupInfo) -> bool:
    """Whether ``algo`` runs ``op`` as NCCL's group of sends and receives across nodes:
    an all-to-all (``auto`` or ``mesh``) over a group that spans nodes. Inside one node
    ``auto`` keeps ``pairwise``, an explicit ``pairwise`` runs its rounds anywhere."""
    return op == "all_to_all" and algo == "mesh" and len(info.domain_sizes()) > 1


@cache
def nccl_tables() -> NcclTables:
    text = resources.files("clustersim.catalog").joinpath("runtimes.yaml").read_text("utf-8")
    return NcclTables.model_validate(load_yaml(text)["nccl"])


@dataclass(frozen=True)
class NcclRuntime:
    """NCCL on one kind of GPU: its tuning model over the group's bandwidths."""

    intra_Bps: float
    inter_Bps: float
    net_latency_s: float
    nvls: bool
    nvls_efficiency: float
    name: str = "nccl"
    only_protocol: str | None = None
    """Run this protocol whatever the tuning model prefers (nccl-tests' ``NCCL_PROTO``)."""
    sharp: bool = False
    """The scale-out switches reduce in the network (InfiniBand SHARP) and CollNet is on:
    an all-reduce across nodes may run ``sharp``, or ``nvls_sharp`` with ``nvls``."""
    message_s: float | None = None
    """The proxy's cost per network message of a send (None: ``p2p.message_us`` of
    ``catalog/runtimes.yaml``; a GPU chip's ``collectives.efa_message_s`` overrides it)."""

    @classmethod
    def of(
        cls,
        chip: ChipSpec,
        *,
        intra_Bps: float,
        inter_Bps: float,
        net_latency_s: float,
        sharp: bool = False,
    ) -> NcclRuntime:
        c = chip.collectives
        message = c.efa_message_s if c.efa_message_s > 0 else None
        return cls(
            intra_Bps,
            inter_Bps,
            net_latency_s,
            c.nvls,
            c.nvls_efficiency,
            sharp=sharp,
            message_s=message,
        )

    def candidates(
        self, op: str, info: GroupInfo, *, defaults: bool = True
    ) -> list[tuple[str, str]]:
        """The (algorithm, protocol) pairs NCCL would consider for ``op`` on this group;
        with ``defaults``, only the protocols it enables by default (not LL128 across nodes)."""
        sizes = info.domain_sizes()
        nodes = len(sizes)
        tables = nccl_tables()
        out = []
        for algo in _ALGORITHMS.get(op, ("ring",)):
            if algo == "nvls" and not (self.nvls and nodes == 1):
                continue
            if algo in _IN_NETWORK:
                equal = nodes > 1 and len(set(sizes)) == 1
                if not (self.sharp and equal) or (
                    algo == "nvls_sharp" and not (self.nvls and sizes[0] > 1)
                ):
                    continue
            table = _TABLE.get(algo, "ring")
            for proto in PROTOCOLS:
                if proto not in tables.base_us.get(table, {}):
                    continue
                if defaults and nodes > 1 and proto not in tables.network_protocols:
                    continue
                out.append((algo, proto))
        return out

    def predict_s(
        self, op: str, p: int, nbytes: float, info: GroupInfo, choice: tuple[str, str]
    ) -> float:
        """NCCL's predicted time of ``op`` with ``choice = (algorithm, protocol)``."""
        algo, proto = choice
        if _grouped(op, algo, info):
            return self._grouped_s(p, nbytes, info, proto)
        t = nccl_tables()
        table = _TABLE.get(algo, "ring")
        sizes = info.domain_sizes()
        nodes, ppn = len(sizes), max(sizes)
        us = 1e-6
        hop, net = t.intra_hop_us[table][proto] * us, self._net_hop_s(table, proto)
        if algo == "double_tree":
            latency = t.base_us[table][proto] * us + 2 * ((ppn - 1) * hop + math.log2(nodes) * net)
        elif algo == "nvls":
            latency = t.base_us[table][proto] * us + hop
        elif algo == "nvls_tree":
            latency = t.base_us[table][proto] * us + hop + 2 * math.log2(nodes) * net
        elif algo in _IN_NETWORK:
            # one traversal of the switches' tree, and the NVLink phases around it
            inside = 0 if ppn == 1 else (1 if algo == "nvls_sharp" else 2)
            latency = t.base_us[table][proto] * us + inside * hop + net
            return latency + nbytes / self._in_network_Bps(algo, ppn, t, proto)
        else:
            phases = 2 if op == "all_reduce" else 1
            steps, s_net = phases * (p - 1), phases * (nodes - 1)
            latency = t.base_us[table][proto] * us + (steps - s_net) * hop + s_net * net
        # NCCL prices a tree over two nodes at the intra-node rate (its channels spread the
        # traffic between them over every NIC), and beyond at the node's NICs together.
        if nodes == 1 or (algo == "double_tree" and nodes <= 2):
            bus = self.intra_Bps
        elif algo == "double_tree":  # a rotation per rank of the smallest node
            bus = min(self.intra_Bps, self.inter_Bps * min(sizes))
        elif algo == "nvls_tree":
            # the switch serves its share of NVLink (NVLS's efficiency), the node's NICs carry
            # its shards; beyond two nodes a tree's inner node halves the NICs' share
            nics = self.inter_Bps * ppn / (1 if nodes <= 2 else 2)
            bus = min(self.intra_Bps * self.nvls_efficiency, nics)
        elif algo in ("ring", "ring_channels") and self._channel_rings(op, info):
            # a channel per rank of the smallest node: each carries one ring's share
            bus = min(self.intra_Bps, self.inter_Bps * min(sizes))
        else:
            bus = min(self.intra_Bps, self.inter_Bps)
        bus *= t.bandwidth_factor[table][proto]
        if algo == "nvls" or (algo == "nvls_tree" and nodes == 1):
            bus *= self.nvls_efficiency
        alg = bus * t.bus_to_alg[table] if table in t.bus_to_alg else bus / busbw_factor(op, p)
        return latency + nbytes / alg

    def _in_network_Bps(self, algo: str, ppn: int, t: NcclTables, proto: str) -> float:
        """Algorithm bandwidth of an in-network all-reduce: the node's NICs carry ``n``
        together, and inside the node NVLS's switch ``n`` per rank (with NCCL's NVLS bus
        to algorithm factor) or the direct phases ``2 (L - 1) / L n`` (see
        :mod:`~clustersim.network.collectives.algorithms.innetwork`)."""
        nics = self.inter_Bps * ppn
        factor = t.bandwidth_factor[_TABLE[algo]][proto]
        if algo == "nvls_sharp":
            bus = min(self.intra_Bps * self.nvls_efficiency, nics) * factor
            return bus * t.bus_to_alg["nvls"]
        inside = math.inf if ppn == 1 else self.intra_Bps * ppn / (2 * (ppn - 1))
        return min(inside, nics) * factor

    def choose(
        self, op: str, p: int, nbytes: float, info: GroupInfo, algorithm: str
    ) -> tuple[str, Protocol]:
        """The fastest (algorithm, protocol) by the tuning model; with an algorithm
        given, the fastest protocol for it (as ``NCCL_ALGO`` leaves the protocol free)."""
        if _grouped(op, "mesh" if algorithm == "auto" else algorithm, info):
            return "mesh", self.grouped_protocol(p, nbytes, info)
        if algorithm in ("nvls", "nvls_tree", "nvls_sharp") and not self.nvls:
            raise ScenarioError(
                f"cluster.collectives.{op}",
                algorithm,
                "needs NVLink SHARP (an NVSwitch that reduces)",
            )
        if algorithm in _IN_NETWORK and not self.sharp:
            raise ScenarioError(
                f"cluster.collectives.{op}",
                algorithm,
                "needs in-network reduction across nodes: an InfiniBand fabric with SHARP "
                "(efa.sharp)",
            )
        if algorithm == "nvls_sharp":
            # NVLS on one node; with one rank per node only the switches' part is left.
            sizes = info.domain_sizes()
            if len(sizes) == 1:
                algorithm = "nvls"
            elif max(sizes) == 1:
                algorithm = "sharp"
        if algorithm == "nvls_tree":
            # NVLS-tree is NVLS on one node; on nodes of unequal sizes the ring runs.
            sizes = info.domain_sizes()
            if len(sizes) == 1:
                algorithm = "nvls"
            elif len(set(sizes)) > 1:
                algorithm = "ring"
        # A forced protocol (NCCL_PROTO) runs even where NCCL would not enable it by default.
        options = self.candidates(op, info, defaults=self.only_protocol is None)
        if algorithm != "auto":
            allowed = {proto for _, proto in self.candidates(op, info)}
            table = nccl_tables().base_us[_TABLE.get(algorithm, "ring")]
            protos = [x for x in PROTOCOLS if x in table]
            if self.only_protocol is None:
                protos = [x for x in protos if x in allowed] or protos
            options = [(algorithm, x) for x in protos]
        if self.only_protocol is not None:
            # NVLS has Simple alone: with another protocol forced, the ring runs.
            options = [o for o in options if o[1] == self.only_protocol] or [
                ("ring", self.only_protocol)
            ]
        algo, proto = min(options, key=lambda ap: self.predict_s(op, p, nbytes, info, ap))
        if algo == "ring" and self._channel_rings(op, info):
            algo = "ring_channels"
        return algo, self.protocol(algo, proto)

    @staticmethod
    def _channel_rings(op: str, info: GroupInfo) -> bool:
        """Whether NCCL's rings for ``op`` spread over every rank's NIC here."""
        sizes = info.domain_sizes()
        return op in _CHANNEL_OPS and len(sizes) > 1 and min(sizes) > 1

    def protocol(self, algo: str, proto: str) -> Protocol:
        """The costs the flow model adds when ``algo`` runs with ``proto``."""
        t = nccl_tables()
        table = _TABLE.get(algo, "ring")
        us = 1e-6
        simple = proto == "Simple"
        # NVLS's efficiency is the switch's: on one node every byte goes through it (the
        # wire factor holds it); NVLS-tree's shards cross the NICs beside it, so there it
        # caps the rate of the rank's flows through the switch instead (``switch_Bps``).
        factor = t.bandwidth_factor[table][proto] * (self.nvls_efficiency if algo == "nvls" else 1)
        through_switch = algo in ("nvls_tree", "nvls_sharp")
        switch = self.intra_Bps * self.nvls_efficiency if through_switch else math.inf
        return Protocol(
            f"{proto}",
            launch_s=t.base_us[table][proto] * us,
            step_s=t.intra_hop_us[table][proto] * us,
            net_step_s=(t.net_hop_us[table][proto] + t.net_post_us * (3 if simple else 1)) * us,
            route_intra=0.0,
            route_inter=2.0 if simple else 1.0,
            wire_factor=1.0 / factor,
            switch_Bps=switch * t.bandwidth_factor[table][proto],
        )

    def grouped_protocol(self, p: int, nbytes: float, info: GroupInfo) -> Protocol:
        """The costs of an all-to-all across nodes run as one group of sends and receives
        (see :func:`_grouped`): one launch, one network hop and the route's latency once
        (every peer's transfer runs at once, so the step waits for the slowest, a network
        one), and the proxy's posting as a bound on each flow's rate, so that no transfer
        ends before its rank has posted every message that crosses nodes."""
        proto = self._p2p_protocol(p, nbytes)
        base = self.protocol("mesh", proto)
        post_s = self.posting_s(p, nbytes, info)
        wire = nbytes / p * base.wire_factor
        cap = wire / post_s if post_s > 0 and wire > 0 else math.inf
        return replace(base, step_s=base.net_step_s, route_intra=base.route_inter, message_Bps=cap)

    def posting_s(self, p: int, nbytes: float, info: GroupInfo) -> float:
        """The proxy's time to post one rank's messages of an all-to-all across nodes:
        a message per chunk of each peer's block, for every peer on another node (the
        most any rank has), one after another."""
        q = nccl_tables().p2p
        cross = p - min(info.domain_sizes())
        per_peer = max(1, math.ceil(nbytes / p / q.chunk_bytes))
        message_s = q.message_us * 1e-6 if self.message_s is None else self.message_s
        return cross * per_peer * message_s

    def _p2p_protocol(self, p: int, nbytes: float) -> str:
        """The protocol of a send of ``nbytes / p``: LL up to NCCL's threshold, else Simple."""
        if self.only_protocol is not None:
            return self.only_protocol
        return "LL" if nbytes / p <= nccl_tables().p2p.ll_threshold_bytes else "Simple"

    def _grouped_s(self, p: int, nbytes: float, info: GroupInfo, proto: str) -> float:
        """The grouped all-to-all's time by hand: launch, a network hop with the route's
        latency, then the slower of the proxy's posting and the wire (each rank's NIC
        carries its blocks for other nodes, its NVLink those for its own)."""
        t = nccl_tables()
        sizes = info.domain_sizes()
        factor = t.bandwidth_factor["ring"][proto]
        wire = max(
            (p - min(sizes)) / p * nbytes / (self.inter_Bps * factor),
            (max(sizes) - 1) / p * nbytes / (self.intra_Bps * factor),
        )
        return self.grouped_latency_s(proto) + max(wire, self.posting_s(p, nbytes, info))

    def grouped_latency_s(self, proto: str) -> float:
        """The fixed part of a grouped all-to-all: NCCL's base latency and one network
        hop with its post overhead and the route's latency (twice for Simple)."""
        return nccl_tables().base_us["ring"][proto] * 1e-6 + self._net_hop_s("ring", proto)

    def _net_hop_s(self, table: str, proto: str) -> float:
        t = nccl_tables()
        simple = proto == "Simple"
        return (
            t.net_hop_us[table][proto] + t.net_post_us * (3 if simple else 1)
        ) * 1e-6 + self.net_latency_s * (2 if simple else 1)
