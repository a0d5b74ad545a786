"""Where a sublayer's tensor-parallel collectives go, and what its backward overlaps.

The forward is the same under every rule: with sequence parallelism an all-gather
of the sequence shards before each column-parallel linear and a reduce-scatter
after each row-parallel one (without it, one all-reduce after the row-parallel
linear). Each blocks the op that consumes it: the Neuron runtime's description
of its own schedule says so ("a TP all-gather precedes the matmul that consumes
it, and a TP reduce-scatter follows the matmul that produces it; these directly
block the next computation", aws-neuron-sdk
neuron-runtime/explore/compute-comm-overlap.rst), and so do Megatron-Core's
layers. The backward mirrors it: an all-gather of the output gradient before
the row-parallel linear's backward (blocking: both its GEMMs read it), and a
reduce-scatter (all-reduce) of the column-parallel linear's input gradient.
What that last collective overlaps is the stack's rule
(``parallelism.tp_comm_overlap``):

- ``blocking``: nothing; it runs after the weight gradient and blocks.
- ``backward``: Megatron-Core's linear layers
  (``LinearWithGradAccumulationAndAsyncCommunication`` in
  megatron/core/tensor_parallel/layers.py; Transformer Engine's ``Linear`` does
  the same): the column-parallel backward all-gathers its sequence-parallel input
  again for the weight gradient, asynchronously under the input-gradient GEMM,
  then starts the input gradient's reduce-scatter (all-reduce without sequence
  parallelism) and runs the weight-gradient GEMM under it.
- ``dataflow``: a compiler that orders work only by explicit dependencies, with
  collectives on their own cores and queues (the Neuron compiler and runtime,
  compute-comm-overlap.rst: collectives are triggered asynchronously on dedicated
  collective cores, and the compiler's compute and communication queues are
  ordered only by dependencies). NeuronX Distributed's linear layers are
  Megatron's (the same re-gather and asynchronous input-gradient collective).
  The TP collectives share one collective stream (the reference setup puts TP on
  stream 0), so they run one after another: the re-gather starts as soon as the
  output gradient's all-gather ends, under the sublayer's input-gradient GEMMs,
  and neither weight-gradient GEMM has a consumer in the sublayer, so both run
  under the reduce-scatter.
- ``userbuffers``: Transformer Engine's userbuffers overlap (``tp_comm_overlap``
  in NeMo and Megatron-Bridge, with sequence parallelism; TransformerEngine
  transformer_engine/pytorch/module/base.py ``initialize_ub``, the
  ``ring_exchange`` and ``pipeline`` methods): ``backward``'s rule, and in the
  forward the column-parallel linear's all-gather runs as a ring exchange under
  its GEMM, chunk by chunk (the local chunk first), and the row-parallel linear's
  reduce-scatter is pipelined with its GEMM's chunks, so only the last chunk's
  reduce-scatter (a quarter of it, ``PIPELINE_SPLITS``) is left after the GEMM;
  in the backward the output gradient's all-gather runs the same way under the
  row-parallel input-gradient GEMM. An overlapped collective still takes the time
  it takes: where it is longer than the GEMM it hides under, the rest is exposed.
  Without sequence parallelism it is ``backward``'s rule (userbuffers needs it).
  Overlapping chunk by chunk splits the GEMM: a ring exchange runs it as ``tp``
  GEMMs of one sequence shard each, the pipelined reduce-scatter as
  ``PIPELINE_SPLITS`` GEMMs (Transformer Engine's ``num_splits``), and a chip with
  a measured GEMM table prices each of those smaller GEMMs
  (``Work.splits``).

The overlapped collectives share the links, and HBM where the chip model meters
it, with the compute they overlap, as every asynchronous collective does.
"""

from __future__ import annotations

from dataclasses import replace

from clustersim.workload.dims import Dims
from clustersim.workload.program import Phase
from clustersim.workload.templates import ACT_BYTES, Tpl, async_coll, coll, wait

__all__ = ["TP_OVERLAP_RULES", "TPComm"]

TP_OVERLAP_RULES = ("blocking", "backward", "dataflow", "userbuffers")

PIPELINE_SPLITS = 4
"""Chunks of a row-parallel GEMM whose reduce-scatter userbuffers pipelines with it:
Transformer Engine's default ``num_splits`` for the ``pipeline`` method
(transformer_engine/pytorch/module/base.py ``initialize_ub``), which NeMo's
userbuffers configs keep."""


def split(tpls: list[Tpl], splits: int) -> list[Tpl]:
    """``tpls`` with each GEMM run as ``splits`` chunks (``Work.splits``)."""
    out: list[Tpl] = []
    for kind, name, phase, work, collective, group, nbytes in tpls:
        chunked = work
        if work is not None and work.matmul is not None and splits > 1:
            chunked = replace(work, splits=splits)
        out.append((kind, name, phase, chunked, collective, group, nbytes))
    return out


B = Phase.BACKWARD


class TPComm:
    """The TP collectives of one sublayer (attention or MLP) under ``dm.tp_overlap``."""

    def __init__(self, dm: Dims) -> None:
        self.on = dm.tp > 1
        self.sp = dm.sequence_parallel
        self.nbytes = dm.tokens * dm.hidden * ACT_BYTES
        self.rule = dm.tp_overlap if self.on else "blocking"
        if self.rule not in TP_OVERLAP_RULES:
            raise ValueError(f"unknown TP overlap rule {self.rule!r}")
        self.chunks = dm.tp
        self.ub = self.rule == "userbuffers" and self.sp
        """Forward and output-gradient collectives overlapped with their GEMMs."""

    @property
    def _reduce(self) -> str:
        return "reduce_scatter" if self.sp else "all_reduce"

    def enter_fwd(self, phase: str) -> list[Tpl]:
        """Before a column-parallel linear: gather the sequence shards."""
        return [coll("tp", "all_gather", phase, self.nbytes)] if self.on and self.sp else []

    def exit_fwd(self, phase: str) -> list[Tpl]:
        """After a row-parallel linear: sum the partial outputs."""
        return [coll("tp", self._reduce, phase, self.nbytes)] if self.on else []

    def exit_bwd(self) -> list[Tpl]:
        """Mirror of ``exit_fwd`` at the start of the block's backward (blocking)."""
        return [coll("tp", "all_gather", B, self.nbytes)] if self.on and self.sp else []

    # -- the dense sublayers: each collective with the GEMM it may overlap

    def column_fwd(self, phase: str, gemm: list[Tpl]) -> list[Tpl]:
        """The sequence shards' all-gather and the column-parallel GEMM that reads it:
        under ``userbuffers`` a ring exchange under the GEMM, else before it."""
        if not self.ub:
            return [*self.enter_fwd(phase), *gemm]
        return [
            async_coll("tp", "all_gather", phase, self.nbytes, ".ring"),
            *split(gemm, self.chunks),
            wait("tp", "all_gather", phase, ".ring"),
        ]

    def row_fwd(self, phase: str, gemm: list[Tpl]) -> list[Tpl]:
        """The row-parallel GEMM and the sum of its partial outputs: under
        ``userbuffers`` the reduce-scatter pipelined with the GEMM's chunks, the last
        chunk's after it, else the whole collective after the GEMM."""
        if not self.ub:
            return [*gemm, *self.exit_fwd(phase)]
        n = PIPELINE_SPLITS
        head = self.nbytes * (n - 1) / n
        return [
            async_coll("tp", "reduce_scatter", phase, head, ".pipe"),
            *split(gemm, n),
            wait("tp", "reduce_scatter", phase, ".pipe"),
            coll("tp", "reduce_scatter", phase, self.nbytes / n),
        ]

    def grad_gather(self) -> list[Tpl]:
        """At the start of the block's backward: the output gradient's all-gather,
        blocking, or (``userbuffers``) started to run under the input-gradient GEMM."""
        if not self.ub:
            return self.exit_bwd()
        return [async_coll("tp", "all_gather", B, self.nbytes, ".grad")]

    def grad_ring(self, gemm: list[Tpl]) -> list[Tpl]:
        """The row-parallel input-gradient GEMM under ``grad_gather``'s ring exchange:
        chunked as the forward's column-parallel GEMM (``userbuffers``)."""
        return split(gemm, self.chunks) if self.ub else gemm

    def grad_gathered(self) -> list[Tpl]:
        """After the row-parallel input-gradient GEMM: wait for ``grad_gather``'s ring."""
        return [wait("tp", "all_gather", B, ".grad")] if self.ub else []

    def enter_bwd(self) -> list[Tpl]:
        """Mirror of ``enter_fwd``, blocking: sum the input gradients of the
        column-parallel dgrad (the blocking rule, and the blocks that keep it)."""
        return [coll("tp", self._reduce, B, self.nbytes)] if self.on else []

    @property
    def defers_wgrad(self) -> bool:
        """Whether the row-parallel linear's weight gradient waits for the reduce-scatter
        (``dataflow``: it runs under it)."""
        return self.rule == "dataflow"

    def regather_early(self) -> list[Tpl]:
        """After the output gradient's all-gather (the TP stream's previous collective):
        ``dataflow`` starts the re-gather of the column-parallel input here."""
        if self.rule == "dataflow" and self.sp:
            return [async_coll("tp", "all_gather", B, self.nbytes, ".input")]
        return []

    def regather_late(self) -> list[Tpl]:
        """Before the column-parallel input-gradient GEMM: ``backward`` starts the
        re-gather of its input here, to run under that GEMM."""
        if self.rule in ("backward", "userbuffers") and self.sp:
            return [async_coll("tp", "all_gather", B, self.nbytes, ".input")]
        return []

    def start_reduce(self) -> list[Tpl]:
        """After the column-parallel input-gradient GEMM: wait for the re-gathered input
        and start the input gradient's reduction (overlapping rules)."""
        if self.rule == "blocking":
            return []
        gathered = [wait("tp", "all_gather", B, ".input")] if self.sp else []
        return [*gathered, async_coll("tp", self._reduce, B, self.nbytes)]

    def finish_reduce(self) -> list[Tpl]:
        """After the weight-gradient GEMMs: the blocking reduction, or the wait for the
        one started under them."""
        if self.rule == "blocking":
            return self.enter_bwd()
        return [wait("tp", self._reduce, B)] if self.on else []
