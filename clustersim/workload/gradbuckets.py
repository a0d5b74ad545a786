"""Data-parallel gradient buckets, cut as Megatron-Core's gradient buffer cuts them.

``grad_buckets`` cuts a stage's gradients into buckets (whole parameters, in
reverse model order, none spanning two model chunks); ``first_chunk_buckets`` and
``grad_bucket_size`` say which chunks are cut and when the reduction runs
(``parallelism.grad_bucketing``, ``parallelism.overlap_grad_reduce``); the gradient
streams emit each bucket's collective where the backward completes it
(``workload.transformer``).
"""

from __future__ import annotations

from collections.abc import Callable

from clustersim.catalog.schema import ModelSpec
from clustersim.scenario.models import ParallelismCfg, TrainingCfg
from clustersim.workload.dims import EXPERT_PIECES, chunk_layers, head_pieces, stage_pieces
from clustersim.workload.layout import Layout
from clustersim.workload.ops import ACT_BYTES
from clustersim.workload.program import Instr, Kind, Phase

__all__ = [
    "BucketKey",
    "Emit",
    "GradSync",
    "Syncs",
    "first_chunk_buckets",
    "grad_bucket_size",
    "grad_buckets",
    "grad_syncs",
    "par_grad_buckets",
    "param_bytes",
]

BucketKey = tuple[int, str]  # (layer, piece)

PARAM_BYTES = {"bf16": ACT_BYTES, "fp32": 4}


def param_bytes(train: TrainingCfg) -> int:
    """Bytes of one parameter, and of its gradient, on the wire and in HBM
    (``training.param_dtype``).

    bf16 (Megatron's mixed precision): 2. fp32 (``torch.autocast``, as NeuronX
    Distributed's BF16 autocast runs): 4. Autocast casts each matmul's inputs to BF16
    and leaves the parameters FP32, and autograd accumulates a leaf's gradient in the
    leaf's dtype. torch-xla's ``ZeroRedundancyOptimizer`` (torch_xla/distributed/
    zero_redundancy_optimizer.py, 2.9.0; NxD's ``NeuronZero1Optimizer`` subclasses it)
    reduce-scatters ``param.grad`` in that dtype (``_reduce_gradients``; with
    ``higher_cc_precision`` it casts to ``optimizer_dtype``, FP32, first) and
    all-gathers the updated shards cast to ``param.dtype``
    (``allgather_weights_and_update_full_parameter``): both move 4 B an element.
    optimum-neuron 0.4.5 (optimum/neuron/accelerate/accelerator.py) casts the model to
    BF16 only in its ``FULL_BF16`` mode, never under ``AUTOCAST_BF16``.
    """
    return PARAM_BYTES[train.param_dtype]


def grad_bucket_size(par: ParallelismCfg) -> float:
    """``grad_bucket_bytes``, or with ``overlap_grad_reduce: false`` (ZeRO 0 and 1) a
    bucket that never fills: one per model chunk, reduced after the whole
    forward-backward. Megatron-Core sets ``bucket_size = None`` without
    ``overlap_grad_reduce``; Megatron-LM as of SC'21 (arXiv 2104.04473) had no overlap
    at all: its local DDP all-reduced each chunk's contiguous gradient buffer in
    ``allreduce_gradients`` after ``forward_backward_func`` (as recalled;
    ``--overlap-grad-reduce`` came in 2023)."""
    late = not par.overlap_grad_reduce and par.zero < 2
    return float(1 << 62) if late else float(par.grad_bucket_bytes)


def first_chunk_buckets(par: ParallelismCfg) -> bool:
    """Whether only the first pipeline stage's first model chunk cuts its gradients
    into buckets (``parallelism.grad_bucketing: first_chunk``), as Megatron-Core's
    ``DistributedDataParallel`` does for ZeRO 0 and 1 (sharded gradients and
    parameters run FSDP's own units, ``workload.sharding``).

    As recalled from megatron/core/distributed/distributed_data_parallel.py
    (``DistributedDataParallel.__init__``): "Turn off bucketing if we are on a
    pipeline stage that is not the first (since data-parallel communication on these
    stages is not on the critical path), or if disable_bucketing is True (e.g., we
    might not want to break up model parameters into buckets for model chunks after
    the first in the interleaved schedule)": ``bucket_size = None`` when the pipeline
    rank is above 0, and megatron/training/training.py ``get_model`` passes
    ``disable_bucketing=(model_chunk_idx > 0)`` (NeMo 2's ``MegatronParallel`` and
    Megatron-Bridge build their chunks the same way, as recalled). With no bucket
    size a chunk's gradient buffer is one bucket, reduced (reduce-scattered under the
    distributed optimizer) once the chunk's last microbatch backward has produced all
    its gradients, and with ``--overlap-param-gather`` gathered as one. Recalled,
    not confirmed against a current release: that both lines are still there (they
    came with the 2023 rewrite of the DDP wrapper), and the default bucket size,
    max(40M, 1M x dp) elements when ``--ddp-bucket-size`` is not given
    (``grad_bucket_bytes`` keeps its own default). Not modelled: with interleaving
    and ``align_grad_reduce`` (its default, as recalled), Megatron-Core's schedule
    launches each chunk's whole gradient sync at once, ``pipeline_rank`` backward
    steps after the chunk's last backward, rather than bucket by bucket. Not on by
    default (``every_chunk``); the docs' calibration and validation page gives what it
    does to the reference rows.
    """
    return par.grad_bucketing == "first_chunk" and par.zero <= 1


def grad_buckets(
    model: ModelSpec,
    layout: Layout,
    stage: int,
    bucket_bytes: float,
    *,
    experts: bool | None = None,
    shared_embedding: bool = False,
    first_only: bool = False,
    elem_bytes: int = ACT_BYTES,
) -> tuple[dict[BucketKey, list[int]], list[int]]:
    """Cut the stage's gradients into buckets as Megatron-Core's gradient buffer does.

    ``_ParamAndGradBuffer`` (megatron/core/distributed/param_and_grad_buffer.py, as
    recalled) walks the parameters in the reverse of their order in the model, which
    is about the order the backward completes them, and keeps each one whole: a
    bucket closes after the parameter that brings it to ``bucket_bytes`` or more, so
    buckets vary in size and the last one may be short. A routed experts' piece is one
    parameter per local expert (Transformer Engine's grouped linear holds ``weight0``,
    ``weight1``, ...); every other piece is one parameter. Each model chunk has a
    buffer of its own (one ``DistributedDataParallel`` per chunk), so no bucket spans
    two chunks. Under the distributed optimizer (``shared_embedding``, for a tied
    model with pp > 1) the embedding and the LM head, which share their weights
    across the first and last stages, each get a bucket of their own
    (``_does_param_require_new_bucket``). Megatron also pads each
    bucket to a multiple of lcm(dp, 128) elements under the distributed optimizer: at
    most a few hundred KiB, left out. A bucket is ready when the piece holding its
    last parameter is. Returns the bucket sizes keyed by that piece, and all sizes in
    order. ``experts`` keeps only the routed experts' pieces (True: reduced over
    ``edp``) or only the others (False: over ``dp``), as Megatron-Core keeps two
    gradient buffers. ``first_only`` (:func:`first_chunk_buckets`) cuts only the first
    pipeline stage's first model chunk at ``bucket_bytes``: every other chunk's
    gradients are one bucket, ready with the chunk's first piece in the model.
    ``elem_bytes`` is a gradient's size (:func:`param_bytes`).
    """
    size = max(int(bucket_bytes), 1)
    whole = 1 << 62  # a bucket that never fills
    if first_only and stage > 0:
        size = whole
    ready: dict[BucketKey, list[int]] = {}
    order: list[int] = []
    open_bytes = 0
    key: BucketKey = (-1, "")
    tied = shared_embedding and model.tied_embeddings and layout.pp > 1
    own = {"embed", "lm_head"} if tied else set()
    local = model.moe.experts // layout.ep if model.moe is not None else 1
    chunk_of = {k: c for c in range(layout.vp) for k in chunk_layers(model, layout, stage, c)}
    ends = {layout.global_chunk(stage, c): c for c in range(layout.vp)}
    heads = {name for name, _ in head_pieces(model, layout.tp)}
    chunk = -1

    def close() -> None:
        nonlocal open_bytes
        ready.setdefault(key, []).append(open_bytes)
        order.append(open_bytes)
        open_bytes = 0

    for layer, name, params in stage_pieces(model, layout, stage):
        if experts is not None and (name in EXPERT_PIECES) != experts:
            continue
        if layer >= 0:
            here = chunk_of.get(layer, chunk)
        else:  # the head's chunk is the model's last, the embedding's its first
            here = ends.get(layout.chunks - 1 if name in heads else 0, chunk)
        if (here != chunk or (name in own and layer < 0)) and open_bytes:
            close()  # a new model chunk, or a shared weight: the open bucket ends
        chunk = here
        if first_only and stage == 0:
            size = max(int(bucket_bytes), 1) if here <= 0 else whole
        key = (layer, name)
        count = local if name in EXPERT_PIECES else 1
        each = params * elem_bytes // count
        if open_bytes + count * each < size:  # the whole piece fits in the open bucket
            open_bytes += count * each
        else:
            for _ in range(count):
                open_bytes += each
                if open_bytes >= size:
                    close()
        if open_bytes and name in own and layer < 0:
            close()
    if open_bytes:
        close()
    return ready, order


def par_grad_buckets(
    model: ModelSpec,
    layout: Layout,
    stage: int,
    par: ParallelismCfg,
    *,
    experts: bool | None,
    elem_bytes: int = ACT_BYTES,
) -> tuple[dict[BucketKey, list[int]], list[int]]:
    """:func:`grad_buckets` cut as ``par`` runs them: its bucket size
    (:func:`grad_bucket_size`), the shared embedding alone under Megatron's distributed
    optimizer (ZeRO-1) and :func:`first_chunk_buckets`; ``elem_bytes`` as there."""
    return grad_buckets(
        model,
        layout,
        stage,
        grad_bucket_size(par),
        experts=experts,
        shared_embedding=par.zero == 1,
        first_only=first_chunk_buckets(par),
        elem_bytes=elem_bytes,
    )


def grad_syncs(
    model: ModelSpec,
    layout: Layout,
    stage: int,
    bucket_bytes: float,
    *,
    collective: str,
    dp_group: str,
    shared_embedding: bool = False,
    first_only: bool = False,
    elem_bytes: int = ACT_BYTES,
) -> list[GradSync]:
    """The gradient streams of a stage: over ``dp_group``, and the routed experts'
    over their shard group (MoE models: ``edp``, or one replica's ``edp_shard`` under
    hybrid sharding). A stream runs when its gradients have more than one holder."""
    out = []
    moe = model.moe is not None
    dense_size = layout.dp * (layout.cp if dp_group in ("dp_cp", "dp_shard") else 1)
    streams = [(dp_group, dense_size, False if moe else None)]
    if moe:
        streams.append((layout.expert_shard_group, layout.edp, True))
    for group, size, experts in streams:
        if size <= 1:
            continue
        ready, sizes = grad_buckets(
            model,
            layout,
            stage,
            bucket_bytes,
            experts=experts,
            shared_embedding=shared_embedding,
            first_only=first_only,
            elem_bytes=elem_bytes,
        )
        out.append(GradSync(ready, collective, group, sizes))
    return out


class Syncs:
    """Emits every gradient stream's buckets that a backward op completes."""

    def __init__(self, syncs: list[GradSync]) -> None:
        self.syncs = syncs

    def emit(self, out: list[Instr], layer: int, mb: int, pieces: tuple[str, ...]) -> None:
        for sync in self.syncs:
            sync.emit(out, layer, mb, pieces)


class GradSync:
    """Emits the gradient buckets of one stream that a backward op completes."""

    def __init__(
        self,
        ready: dict[BucketKey, list[int]],
        collective: str,
        group: str = "dp",
        sizes: list[int] | None = None,
    ) -> None:
        self.ready = ready
        self.collective = collective
        self.group = group
        self.sizes = sizes or []
        self.name = f"{group}.{collective}"

    def emit(self, out: list[Instr], layer: int, mb: int, pieces: tuple[str, ...]) -> None:
        for piece in pieces:
            for nbytes in self.ready.get((layer, piece), ()):
                out.append(self._instr(layer, mb, nbytes))

    def emit_all(self, out: list[Instr]) -> None:
        """Every bucket, in gradient order (``overlap_grad_reduce: false``)."""
        out.extend(self._instr(-1, -1, nbytes) for nbytes in self.sizes)

    def _instr(self, layer: int, mb: int, nbytes: int) -> Instr:
        return Instr(
            Kind.ASYNC_COLLECTIVE,
            self.name,
            Phase.GRAD_SYNC,
            layer,
            mb,
            collective=self.collective,
            group=self.group,
            nbytes=float(nbytes),
        )


Emit = Callable[[list[Instr], int, int, tuple[str, ...]], None]
