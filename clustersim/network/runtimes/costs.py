"""What a communication runtime adds to the wire time of a collective.

The flow model moves a collective's bytes over the links; the runtime adds fixed
costs that no link shows: the collective's launch, a handshake per synchronous
round, and the posting of each message (a DMA descriptor chain on Trainium, an
EFA send on the scale-out network). A :class:`Protocol` prices them; a
:class:`Runtime` chooses the algorithm and protocol of each collective
(:func:`~.cluster.runtime_of` builds the chip's: the Neuron runtime on Trainium,
NCCL's tuning model on GPUs, :mod:`.nccl`). A step of ``k`` identical rounds
with route latency ``L`` costs, where ``f`` is the fraction of its pairs that cross
scale-up domains, ``m`` the most messages a rank posts in it and ``m_efa`` the most
of those that cross:

    route = (1 - f) x route_intra x L + f x route_inter x L
    hand  = ring_step_s if the step is a ring's (pipelined) and the runtime prices
            ring steps apart, else (1 - f) x step_s + f x net_step_s
    fixed = hand + m x message_s + m_efa x efa_message_s
    step  = k x (route + fixed)

and the collective adds ``launch_s`` once. Posting is serial per rank, which is why
a mesh round over 63 peers costs 63 messages while a ring round costs one.

Every round pays a handshake, a ring's too. On the Neuron runtime a ring's step
has a handshake of its own, ``ring_step_s``: the step waits only for its
neighbour's chunk, where a round of halving-doubling or a mesh waits for a
partner (or every peer) that has just finished a whole round of its own. That a
ring step waits for the step before at all is inferred from nccom-test's
all-reduce over 2 x trn1.32xlarge, not documented: its 1 MiB all-reduce takes
0.9 ms more than its 8-byte floor, which is what the 62 ring steps inside the two
instances add over the 8-byte meshes
(about 18 us a step: the fitted 12 us handshake, a message posted each way, the
hop), and which a ring that streams its chunks, paying one handshake as its
pipeline's fill (the model before), cannot produce. That the two handshakes
differ is the fit's, not a documented figure, and how much they differ depends
on the launch, which the measured nccom-test curves leave open (``validation/fit_collectives.py``):
at a launch of 420 us both are 13 us. NCCL's tuning model charges its hop
latency per ring step like any other round (``ring_step_s`` unset).

A round that is not pipelined posts each message to a few DMA queues, so one
message moves at most ``message_Bps`` (:meth:`Protocol.message_cap_Bps`), and at
``reduce_throughput`` of that when the receiver reduces it (DMA engines before
NeuronCore-v4 reduce at half their copy rate). A pipelined ring spreads its stream
over every queue and is bound by the links alone. ``wire_factor`` multiplies the
bytes on the wire (NCCL's LL protocol sends a flag with every 4 bytes).

With every cost zero (:data:`NO_COSTS`, what the closed-form consistency checks
use) a collective costs exactly its alpha-beta time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol as TypingProtocol

import numpy as np
from numpy.typing import NDArray

from clustersim.catalog.schema import ChipSpec
from clustersim.errors import ScenarioError
from clustersim.network.collectives import GroupInfo, Step, choose

__all__ = ["NO_COSTS", "NeuronRuntime", "Protocol", "Runtime", "neuron_protocol"]


@dataclass(frozen=True)
class Protocol:
    """The fixed costs of one runtime protocol, in seconds (see the module doc)."""

    name: str = "default"
    launch_s: float = 0.0
    step_s: float = 0.0
    net_step_s: float = 0.0
    message_s: float = 0.0
    efa_message_s: float = 0.0
    ring_step_s: float | None = None
    """The handshake of a ring's step (a pipelined one); None: what any round pays."""
    message_lanes: int = 1
    """Messages of one round a rank posts at once (1: one after another, as the
    collective fits assume). A round of ``m`` messages pays ``ceil(m / lanes)`` x
    ``message_s``."""
    route_intra: float = 1.0
    route_inter: float = 1.0
    wire_factor: float = 1.0
    message_Bps: float = math.inf
    reduce_throughput: float = 1.0
    switch_Bps: float = math.inf
    """What a scale-up switch that reduces (NVLink SHARP) serves one rank in a step of
    NVLS-tree: that rank's flows inside its domain share it (:meth:`switch_cap_Bps`)."""

    @property
    def zero(self) -> bool:
        return not (
            self.launch_s
            or self.step_s
            or self.net_step_s
            or self.message_s
            or self.efa_message_s
            or self.ring_step_s
        )

    @property
    def ring_handshake_s(self) -> float:
        """What a ring's step pays for its handshake inside a domain."""
        return self.step_s if self.ring_step_s is None else self.ring_step_s

    def step_latency_s(
        self,
        step: Step,
        pairs: NDArray[np.int64],
        crosses: NDArray[np.bool_],
        route_s: float,
    ) -> float:
        """The latency of ``step`` over ``pairs`` (positions), with ``crosses[i]`` whether
        pair ``i`` crosses domains and ``route_s`` the longest route's latency."""
        repeats = step.repeats
        if not pairs.size:
            return repeats * route_s
        if step.hops is not None:
            intra, inter = step.hops
            route = (intra * self.route_intra + inter * self.route_inter) * route_s
            if self.zero:
                return route
            return route + intra * self.step_s + inter * self.net_step_s
        f, most, most_crossing = _fan_out(pairs, crosses)
        route = ((1 - f) * self.route_intra + f * self.route_inter) * route_s
        if self.zero:
            return repeats * route
        if step.pipelined and self.ring_step_s is not None:
            fixed = self.ring_step_s
        else:  # a ring of NCCL's pays its hop latency like any round
            fixed = (1 - f) * self.step_s + f * self.net_step_s
        fixed += math.ceil(most / self.message_lanes) * self.message_s
        if self.efa_message_s and f:
            fixed += most_crossing * self.efa_message_s
        return repeats * (route + fixed)

    def message_cap_Bps(self, *, pipelined: bool, reduces: bool) -> float:
        """The bound on one message's rate in a round (infinite for pipelined rounds)."""
        if pipelined or self.message_Bps == math.inf:
            return math.inf
        return self.message_Bps * (self.reduce_throughput if reduces else 1.0)

    def switch_cap_Bps(self, inside_flows: int) -> float:
        """The bound on each flow's rate in a step where a rank has ``inside_flows`` flows
        through its domain's reducing switch (infinite without one). The step's flows that
        cross domains carry no more than those inside, so the bound never slows them past
        the switch's own time."""
        if self.switch_Bps == math.inf or inside_flows < 1:
            return math.inf
        return self.switch_Bps / inside_flows


class Runtime(TypingProtocol):
    """A communication runtime: what ``auto`` runs, and how each protocol is priced."""

    @property
    def name(self) -> str: ...

    def choose(
        self, op: str, p: int, nbytes: float, info: GroupInfo, algorithm: str
    ) -> tuple[str, Protocol]:
        """The algorithm (``algorithm`` itself unless it is ``auto``) and protocol that
        run ``op`` of ``nbytes`` over a group placed as ``info``."""
        ...


@dataclass(frozen=True)
class NeuronRuntime:
    """The Neuron runtime: its size rule
    (:func:`~clustersim.network.collectives.registry.choose`), one protocol."""

    protocol: Protocol = field(default_factory=Protocol)
    name: str = "neuron"

    def choose(
        self, op: str, p: int, nbytes: float, info: GroupInfo, algorithm: str
    ) -> tuple[str, Protocol]:
        if algorithm in ("nvls", "nvls_tree"):
            raise ScenarioError(
                f"cluster.collectives.{op}", algorithm, "needs NCCL and an NVSwitch that reduces"
            )
        if algorithm in ("sharp", "nvls_sharp"):
            raise ScenarioError(
                f"cluster.collectives.{op}",
                algorithm,
                "needs NCCL and an InfiniBand fabric that reduces in the network (efa.sharp)",
            )
        name = choose(op, p, nbytes, info) if algorithm == "auto" else algorithm
        return name, self.protocol


NO_COSTS = NeuronRuntime()
"""No runtime overheads: a collective costs its wire time alone."""


def neuron_protocol(chip: ChipSpec) -> Protocol:
    """The Neuron runtime's costs on ``chip``, from its ``collectives`` block."""
    c = chip.collectives
    engines = c.message_engines * chip.dma_engine_Bps
    return Protocol(
        "neuron",
        launch_s=c.launch_s,
        step_s=c.step_s,
        net_step_s=c.step_s,
        message_s=c.message_s,
        efa_message_s=c.efa_message_s,
        ring_step_s=c.ring_step_s,
        message_Bps=engines if engines > 0 else math.inf,
        reduce_throughput=chip.dma_reduce_throughput,
    )


_FANS: dict[
    tuple[int, int], tuple[NDArray[np.int64], NDArray[np.bool_], tuple[float, int, int]]
] = {}
_MAX_FANS = 4096


def _fan_out(pairs: NDArray[np.int64], crosses: NDArray[np.bool_]) -> tuple[float, int, int]:
    """The fraction of ``pairs`` that cross domains (``crosses``), the most pairs from one
    source, and the most of those that cross from one source (0 when none does); kept per
    pair of arrays (a collective's steps are priced for every buffer size on the same
    ones)."""
    key = (id(pairs), id(crosses))
    found = _FANS.get(key)
    if found is not None and found[0] is pairs and found[1] is crosses:
        return found[2]
    f = float(np.count_nonzero(crosses)) / crosses.size
    sources = pairs[:, 0]
    most = int(np.bincount(sources).max())
    most_crossing = int(np.bincount(sources[crosses]).max()) if f else 0
    if len(_FANS) >= _MAX_FANS:
        _FANS.clear()
    _FANS[key] = (pairs, crosses, (f, most, most_crossing))  # holds both: their ids stay theirs
    return f, most, most_crossing
