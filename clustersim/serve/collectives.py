"""The tensor-parallel all-reduce of one replica, timed by the project's collective model.

A replica's ``tp`` ranks are placed as a scenario places them (ranks in chip order,
``cores / lnc`` per chip) on the scenario's fabric. Each distinct message size runs
once alone over one :class:`~clustersim.network.Network` (empty between sizes),
with the chip's communication runtime (its fixed costs: at TP 32-64 the small
messages of decode are latency-bound, and those costs are most of their time), and
the time is cached: every replica is placed alike, and their collectives do not
share links (each replica spans its own chips).

On the Neuron runtime a serving iteration is one execution of a compiled program (a
NEFF holding every layer, as NxD Inference and Transformers-NeuronX compile the
context-encoding and token-generation models), whose collectives the compute engines
trigger from inside it over DMA rings the runtime built at load
(``aws-neuron-sdk:neuron-runtime/explore/compute-comm-overlap.rst``). So
:func:`in_program_protocol`:

- the runtime's ``launch_s``, which nccom-test pays once per collective because it
  executes each collective as a program of its own, is paid once per iteration
  (:attr:`TpAllReduce.launch_s`, added by the iteration model), not per collective;
- the messages of a round are posted on the rank's DMA engines together: the
  rank has ``dma_queues x lnc`` engines, each message occupies the
  ``collectives.message_engines`` the fit found one message to use, so
  ``floor(dma_queues x lnc / message_engines)`` messages go at once (16 engines per
  NeuronCore: ``nki/deep-dives/nki-dma-bandwidth-guide.rst``; each engine serves up
  to 16 rings: ``compute-comm-overlap.rst``). The training fit's serial posting
  (``message_lanes`` 1) is what its host-launched microbenchmark rounds show; a
  mesh round over 63 peers, posted serially, would alone cost more than a published
  TP64 decode step leaves for both of a layer's all-reduces
  (``aws-neuron-sdk:libraries/nxd-inference/tutorials/llama70b_perf_comparison.csv``).

The handshake per round, the posting cost per message and the wire are the
runtime's fitted costs unchanged.

On GPUs the serving engines do not all-reduce through NCCL inside a node: vLLM runs
its custom all-reduce (``vllm/distributed/device_communicators/custom_all_reduce.py``:
one-shot or two-shot over NVLink peer buffers, inside its CUDA graphs) and
TensorRT-LLM its own (one-shot, two-shot or NCCL, as its ``AUTO`` strategy picks by
size; vLLM only up to 8 MiB, NCCL above). A replica within one node whose GPU count
and message size the engine's measured all-reduce covers
(:func:`~clustersim.hardware.kernels.allreduce_table`, NVIDIA's measurements of each
engine's kernel) takes its time from it; elsewhere
(across nodes, or past the largest size measured) NCCL's model times it.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import simpy

from clustersim.catalog.schema import ChipSpec
from clustersim.hardware.kernels import AllReduceTable, allreduce_table
from clustersim.network import Network
from clustersim.network.fabric import Topology, build_topology
from clustersim.network.runtimes import (
    NO_COSTS,
    NeuronRuntime,
    Protocol,
    Runtime,
    neuron_protocol,
    runtime_of,
)
from clustersim.scenario import Resolved

__all__ = [
    "VLLM_CUSTOM_MAX_BYTES",
    "DpGather",
    "TpAllReduce",
    "in_program_protocol",
    "replica_network",
    "replica_topology",
]

VLLM_CUSTOM_MAX_BYTES = 8 * 2**20
"""The largest message vLLM's custom all-reduce takes (``CustomAllreduce``'s default
``max_size``, 8 MiB, ``vllm/distributed/device_communicators/custom_all_reduce.py``);
larger ones go through NCCL."""


def replica_topology(res: Resolved, ranks: int) -> Topology:
    """The fabric a replica of ``ranks`` ranks is placed on: the instances its ranks fill,
    in whole UltraServers where the instance is part of one."""
    instances = max(1, math.ceil(ranks / res.ranks_per_node))
    us = res.instance.ultraserver
    if us is not None:
        instances = math.ceil(instances / us.instances) * us.instances
    return build_topology(res.instance, res.chip, instances)


def replica_network(
    topology: Topology, rank_chip: list[int], algorithms: dict[str, str], runtime: Runtime
) -> Network:
    """A network of its own to time a replica's transfers on, one after another: between
    two of them it holds no flow, so each runs alone, as in a fresh environment (building
    one costs more than most of the transfers it times)."""
    return Network(simpy.Environment(), topology, rank_chip, algorithms, runtime=runtime)


def in_program_protocol(chip: ChipSpec, lnc: int) -> Protocol:
    """The Neuron runtime's costs for a collective inside a compiled program: no launch
    of its own, and a round's messages posted on the rank's DMA engines together
    (module doc)."""
    base = neuron_protocol(chip)
    queues = chip.engines.dma_queues * lnc if chip.engines is not None else 1
    per_message = chip.collectives.message_engines
    lanes = max(1, int(queues // per_message)) if per_message > 0 else queues
    return replace(base, launch_s=0.0, message_lanes=lanes)


class TpAllReduce:
    """``self(nbytes)``: seconds of one all-reduce of ``nbytes`` over a replica's ranks.

    ``overheads=False`` leaves the runtime's fixed costs out (the wire time alone, as
    the collective microbenchmark's ``overheads=False``): a diagnostic, not a scenario key.
    ``engine`` names the serving engine, whose measured all-reduce a GPU replica inside one
    node runs (module doc)."""

    def __init__(
        self, res: Resolved, tp: int, *, overheads: bool = True, engine: str | None = None
    ) -> None:
        per_node = res.ranks_per_node
        self.topology = replica_topology(res, tp)
        self.runtime = runtime_of(res.chip, res.instance) if overheads else NO_COSTS
        self.launch_s = 0.0
        """What one iteration (one program execution) pays to launch, on Neuron."""
        if overheads and res.chip.runtime == "neuron":
            self.runtime = NeuronRuntime(in_program_protocol(res.chip, res.lnc))
            self.launch_s = res.chip.collectives.launch_s if tp > 1 else 0.0
        self.measured: AllReduceTable | None = None
        """The engine's measured all-reduce, where it covers this replica's GPUs."""
        self.measured_max_bytes = 0.0
        """The largest message it takes (vLLM's custom all-reduce stops at 8 MiB)."""
        if overheads and engine in ("vllm", "trtllm") and res.chip.family == "gpu":
            table = allreduce_table(res.chip.name, "vllm" if engine == "vllm" else None)
            if table is not None and table.measures(tp) and tp <= per_node:
                self.measured = table
                self.measured_max_bytes = table.max_bytes
                if engine == "vllm":
                    self.measured_max_bytes = min(table.max_bytes, VLLM_CUSTOM_MAX_BYTES)
        self.rank_chip = [r // res.ranks_per_chip for r in range(tp)]
        self.group = list(range(tp))
        self.algorithms = dict(res.scenario.cluster.collectives)
        self._cache: dict[float, float] = {}
        self._net: Network | None = None

    def fresh(self) -> TpAllReduce:
        """The same all-reduce on a network of its own: timing a size on it leaves this
        one's clock alone (a duration read off a clock that has run other sizes first
        may differ in its last bit)."""
        other = copy.copy(self)
        other._cache, other._net = {}, None
        return other

    def covers(self, nbytes: float) -> bool:
        """Whether an all-reduce of ``nbytes`` takes its time from the measured table."""
        return self.measured is not None and nbytes <= self.measured_max_bytes

    def __call__(self, nbytes: float) -> float:
        if len(self.group) < 2:
            return 0.0
        if self.measured is not None and self.covers(nbytes):
            return self.measured.time_s(len(self.group), nbytes)
        return self.simulated_s(nbytes)

    def simulated_s(self, nbytes: float) -> float:
        """The all-reduce as the flow model and the runtime's costs time it."""
        if len(self.group) < 2:
            return 0.0
        cached = self._cache.get(nbytes)
        if cached is None:
            if self._net is None:  # one network for every size (replica_network)
                self._net = replica_network(
                    self.topology, self.rank_chip, self.algorithms, self.runtime
                )
            env = self._net.env
            start = env.now
            env.run(until=self._net.collective("all_reduce", self.group, nbytes))
            cached = self._cache[nbytes] = float(env.now - start)
        return cached


class DpGather:
    """``self(nbytes)``: seconds of one MoE layer's exchange across a replica's attention
    data-parallel groups: an all-gather of every group's tokens (``nbytes``, the whole
    gathered buffer), then a reduce-scatter of the experts' output of the same size.

    The ``attention_dp`` groups of ``tp`` ranks are placed one after another; rank ``j``
    of every group exchanges with rank ``j`` of the others (vLLM's data-parallel group
    beside its tensor-parallel one; its allgather-reducescatter all2all backend), the
    ``tp`` such exchanges at once, sharing the fabric. NCCL's model times them (the
    engines' own all-reduce kernels do not run these)."""

    def __init__(self, res: Resolved, tp: int, attention_dp: int) -> None:
        ranks = tp * attention_dp
        self.topology = replica_topology(res, ranks)
        self.runtime = runtime_of(res.chip, res.instance)
        self.rank_chip = [r // res.ranks_per_chip for r in range(ranks)]
        self.group = tuple(g * tp for g in range(attention_dp))
        self.replicas = (
            [[g * tp + j for g in range(attention_dp)] for j in range(tp)] if tp > 1 else None
        )
        self.algorithms = dict(res.scenario.cluster.collectives)
        self._cache: dict[float, float] = {}
        self._net: Network | None = None

    def __call__(self, nbytes: float) -> float:
        if len(self.group) < 2 or nbytes <= 0:
            return 0.0
        cached = self._cache.get(nbytes)
        if cached is None:
            if self._net is None:
                self._net = replica_network(
                    self.topology, self.rank_chip, self.algorithms, self.runtime
                )
            env = self._net.env
            start = env.now
            for op in ("all_gather", "reduce_scatter"):
                done = self._net.collective(op, self.group, nbytes, replicas=self.replicas)
                env.run(until=done)
            cached = self._cache[nbytes] = float(env.now - start)
        return cached
