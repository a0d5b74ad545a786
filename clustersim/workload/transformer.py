"""Per-stage programs of one training step of a dense decoder-only transformer.

``build_programs`` returns one ``Program`` per pipeline stage; every rank of a
stage (its TP, CP and DP peers) runs it. A program is:

1. the stage's forwards and backwards, in the order of the pipeline schedule
   (``schedules``). A forward of any model chunk but the first starts by
   receiving the activations from the stage of the previous chunk, and of any
   but the last ends by sending them on; a backward mirrors this with gradients.
   Without interleaving chunk ``c`` is stage ``c``; with ``virtual_stages: v``
   the stage of chunk ``c`` is ``c % pp``, so the last stage sends to the first.
   Tags pair each send with its receive: ``2*microbatch`` for activations,
   ``2*microbatch + 1`` for gradients (times ``v``, plus the local chunk);
2. before each layer's backward, its recompute (``parallelism.recompute``):
   ``selective`` reruns the attention core, ``full`` the whole layer forward (under
   the ``dataflow`` TP rule beside the backward of the layer after it, but for the
   first layer a backward reaches: ``overlap.interleave_recompute``);
3. data-parallel gradient reduction in buckets of about ``grad_bucket_bytes`` (the
   gradients of the rank's parameters, bf16 or under ``training.param_dtype: fp32``
   FP32, whole parameters as Megatron-Core cuts them:
   ``grad_buckets``), each started asynchronously right after
   the last microbatch's backward op that completes it, so it overlaps with the
   rest of the backward: an all-reduce, or a reduce-scatter under ZeRO-1;
4. a wait for those buckets, the Adam step (on 1/dp of the parameters under
   ZeRO-1), and under ZeRO-1 an all-gather of the updated parameters (in their dtype), in
   the same buckets. With ``overlap_param_gather`` (Megatron's distributed
   optimizer) the gathers run under the next step's forward instead, dispatched
   as Megatron-Core dispatches them (``paramgather``): one bucket ahead of the
   layer that first uses it, or a model chunk ahead with interleaving.

Not modelled: the tiny all-reduces of gradient norms (clipping) and of the
replicated norm weights' gradients across TP; tied embeddings are lowered as
untied (a tied model's last stage holds its own copy of the table, as Megatron
does with pp > 1).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

from clustersim.catalog.schema import ModelSpec
from clustersim.hardware.work import Work
from clustersim.scenario.models import MoECfg, ParallelismCfg, TrainingCfg
from clustersim.workload.checks import validate
from clustersim.workload.dims import (
    Dims,
    chunk_layers,
    head_pieces,
    make_dims,
    optimizer_params,
    stage_layers,
)
from clustersim.workload.ends import embed_block, head_block, mtp_block
from clustersim.workload.gradbuckets import (
    Emit,
    Syncs,
    first_chunk_buckets,
    grad_bucket_size,
    grad_buckets,
    grad_syncs,
    param_bytes,
)
from clustersim.workload.layers import LayerBlocks, moe_sublayer
from clustersim.workload.layout import Layout
from clustersim.workload.ops import ACT_BYTES, Block, Tpl
from clustersim.workload.overlap import (
    a2a_overlap,
    interleave,
    interleave_recompute,
    pair_units,
    recompute_beside,
)
from clustersim.workload.paramgather import HEAD, ParamGathers
from clustersim.workload.program import Instr, Kind, Phase, Program
from clustersim.workload.recompute import modules_of
from clustersim.workload.schedules import Order, dualpipe_units, stage_order
from clustersim.workload.sharding import shard_program

__all__ = [
    "ADAM_HBM_BYTES_PER_PARAM",
    "ADAM_SCALAR_OPS_PER_PARAM",
    "ADAM_VECTOR_OPS_PER_PARAM",
    "adam_work",
    "build_programs",
    "first_chunk_buckets",
    "grad_bucket_size",
    "grad_buckets",
    "microbatches",
]

# Adam with FP32 master weights, per parameter: read the bf16 gradient (2 B), the
# master weight and both moments (4 B each), write them back (12 B) and write the
# bf16 weight (2 B). About 14 element ops: moment updates, bias correction, the
# update with weight decay and the casts on the vector engine; sqrt and
# reciprocal on the scalar engine.
ADAM_HBM_BYTES_PER_PARAM = 2 + 12 + 12 + 2
ADAM_VECTOR_OPS_PER_PARAM = 12
ADAM_SCALAR_OPS_PER_PARAM = 2


def microbatches(par: ParallelismCfg, train: TrainingCfg, layout: Layout) -> int:
    """Microbatches per step on each DP replica: global batch / (dp * microbatch size)."""
    return train.global_batch_size // (layout.dp * par.microbatch_size)


def _stamp(out: list[Instr], tpls: tuple[Tpl, ...], layer: int, mb: int) -> None:
    app = out.append
    for kind, name, phase, work, coll, group, nbytes in tpls:
        app(Instr(kind, name, phase, layer, mb, work, coll, group, nbytes))


def build_programs(
    model: ModelSpec,
    par: ParallelismCfg,
    train: TrainingCfg,
    layout: Layout,
    *,
    moe: MoECfg | None = None,
    seed: int = 0,
    lowering: str = "fused",
) -> list[Program]:
    """One program per pipeline stage; raises ``ScenarioError`` for an invalid layout.

    ``moe`` and ``seed`` set the token routing of MoE layers (``workload.moe``);
    ``lowering`` how the elementwise ops run (``workload.titan``: fused, eager, compiled).
    """
    validate(model, par, train, layout)
    # Hundreds of thousands of small acyclic objects: the cyclic collector would
    # rescan them again and again (half the build time) and can free nothing.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _build(model, par, train, layout, moe=moe, seed=seed, lowering=lowering)
    finally:
        if enabled:
            gc.enable()


def _build(
    model: ModelSpec,
    par: ParallelismCfg,
    train: TrainingCfg,
    layout: Layout,
    *,
    moe: MoECfg | None,
    seed: int,
    lowering: str = "fused",
) -> list[Program]:
    dm = make_dims(model, par, train, layout)
    n_mb = microbatches(par, train, layout)
    blocks = LayerBlocks(
        model,
        dm,
        precision=train.precision,
        recompute=par.recompute,
        modules=modules_of(par),
        attention=par.attention,
        moe_part=moe_sublayer(model, par, train, layout, cfg=moe, seed=seed),
        bf16_layers=train.fp8.bf16_layers,
        lowering=lowering,
    )
    embed = embed_block(dm)
    head = head_block(dm)
    mtp = mtp_block(dm, train.precision) if model.mtp_layers else None
    p2p_bytes, gather_bytes = pipeline_message_bytes(dm, layout)
    programs = []
    pp, vp = layout.pp, layout.vp
    overlap = a2a_overlap(par, model, layout)
    for stage in range(pp):
        order = stage_order(par.schedule, stage, pp, n_mb, vp, overlap=overlap)
        chunks = [chunk_layers(model, layout, stage, k) for k in range(vp)]
        prog = Program(stage=stage, layers=tuple(stage_layers(model, layout, stage)))
        out = prog.instrs
        # A chunk's last backward completes its gradients: its DP buckets start there.
        # ZeRO-2 reduce-scatters every microbatch's gradients into the shards; ZeRO-3
        # reduces per FSDP unit (``sharding.shard_program``).
        last_b = {k: i for i, (kind, _, k) in enumerate(order) if kind == "B"}
        emit_at = set(last_b.values())
        if par.zero == 2:
            emit_at = {i for i, (kind, _, _) in enumerate(order) if kind == "B"}
        late = not par.overlap_grad_reduce and par.zero < 2  # after the backward
        if late:
            emit_at = set()
        dp_group = layout.grad_group(par.zero)  # dp_cp under context parallelism
        collective = "reduce_scatter" if par.zero >= 1 else "all_reduce"
        syncs = grad_syncs(
            model,
            layout,
            stage,
            grad_bucket_size(par),
            collective=collective,
            dp_group=dp_group,
            shared_embedding=par.zero == 1,  # Megatron's distributed optimizer
            first_only=first_chunk_buckets(par),
            elem_bytes=param_bytes(train),
        )
        sync = Syncs(syncs)
        dp_on = bool(syncs)
        gather_early = par.zero == 1 and par.overlap_param_gather
        gathers = None
        if gather_early and syncs:  # Megatron's distributed optimizer: under the forward
            gathers = ParamGathers(
                [(s.group, s.ready) for s in syncs],
                chunks,
                frozenset(name for name, _ in head_pieces(model, layout.tp)),
            )
            gathers.start(out)
        # Offsets to the stages of the previous and next chunk (the last stage's
        # next chunk, and the first stage's previous one, wrap around).
        prev, nxt = _neighbours(layout, stage)

        ctx = _StageCtx(
            stage,
            order,
            chunks,
            layout,
            blocks,
            embed,
            head,
            p2p_bytes,
            gather_bytes,
            prev,
            nxt,
            emit_at,
            sync.emit if (dp_on and par.zero < 3) else None,
            model.layers,
            mtp,
            1 + model.mtp_layers,
            gathers,
            recompute_beside(par, dm),
        )
        units: list[tuple[int, ...]] = [(i,) for i in range(len(order))]
        if overlap:
            units = dualpipe_units(stage, pp, n_mb) if layout.vshape else pair_units(order)
        for unit in units:
            if len(unit) == 1:
                _item(ctx, unit[0], out)
                continue
            first: list[Instr] = []
            second: list[Instr] = []
            _item(ctx, unit[0], first)
            _item(ctx, unit[1], second)
            out.extend(interleave(first, second))
        if dp_on:
            for grad_sync in syncs if late else ():
                grad_sync.emit_all(out)
            out.append(Instr(Kind.WAIT_ASYNC, "dp.wait", Phase.GRAD_SYNC))
        params = optimizer_params(model, layout, stage, par.zero)
        if dp_on and par.zero >= 2:
            shard_program(prog, model, par, layout, n_mb)
        out.append(
            Instr(
                Kind.COMPUTE,
                "optimizer",
                Phase.OPTIMIZER,
                work=adam_work(params, param_bytes(train)),
            )
        )
        if par.zero in (1, 2) and not gather_early:
            for grad_sync in syncs:
                for nbytes in grad_sync.sizes:
                    out.append(
                        Instr(
                            Kind.COLLECTIVE,
                            f"{grad_sync.group}.all_gather",
                            Phase.PARAM_SYNC,
                            collective="all_gather",
                            group=grad_sync.group,
                            nbytes=float(nbytes),
                        )
                    )
        programs.append(prog)
    return programs


@dataclass(frozen=True)
class _StageCtx:
    """What ``_item`` needs of one stage's build."""

    stage: int
    order: Order
    chunks: list[range]
    layout: Layout
    blocks: LayerBlocks
    embed: Block
    head: Block
    p2p_bytes: float
    gather_bytes: float
    prev: tuple[int, ...]  # per local chunk: the stage offset its input comes from
    nxt: tuple[int, ...]  # and its output goes to (0: the same stage, no message)
    emit_at: set[int]
    emit: Emit | None
    main_layers: int  # blocks from here on are multi-token-prediction modules
    mtp: Block | None
    head_passes: int  # the LM head's, one more per MTP module
    gathers: ParamGathers | None = None  # ZeRO-1's gathers chained under the forward
    recompute_beside: bool = False  # a layer's recompute runs beside the next backward


def _item(ctx: _StageCtx, i: int, out: list[Instr]) -> None:
    """Append the instructions of the ``i``-th item of the stage's order."""
    kind, mb, k = ctx.order[i]
    layout, stage = ctx.layout, ctx.stage
    c = layout.global_chunk(stage, k)
    prev, nxt = ctx.prev[k], ctx.nxt[k]
    first, last = c == 0, c == layout.chunks - 1
    layers = ctx.chunks[k]
    if kind == "F":
        gathers = ctx.gathers if mb == 0 else None  # the step's first use of each part
        if gathers is not None:
            gathers.use_chunk(out, k)
        if first:
            if gathers is not None:
                gathers.use(out, -1)
            _stamp(out, ctx.embed.fwd, -1, mb)
        elif prev:
            tag = _tag(mb, c - 1, layout, grad=False)
            out.append(_p2p(Kind.RECV, "pp.recv.act", mb, prev, nbytes=ctx.p2p_bytes, tag=tag))
            _gather(out, "pp.gather.act", Phase.FORWARD, mb, ctx.gather_bytes)
        for lay in layers:
            if gathers is not None:
                gathers.use(out, gathers.index.get(lay, HEAD))
            if ctx.mtp is not None and lay >= ctx.main_layers:
                _stamp(out, ctx.mtp.fwd, lay, mb)
            _stamp(out, ctx.blocks[lay].fwd, lay, mb)
        if last:  # the LM head, and its pass for each MTP module's prediction
            if gathers is not None:
                gathers.use(out, HEAD)
            for _ in range(ctx.head_passes):
                _stamp(out, ctx.head.fwd, -1, mb)
        elif nxt:
            tag = _tag(mb, c, layout, grad=False)
            out.append(_p2p(Kind.SEND, "pp.send.act", mb, nxt, nbytes=ctx.p2p_bytes, tag=tag))
        return
    emit = ctx.emit if i in ctx.emit_at else None
    if last:
        for _ in range(ctx.head_passes - 1):  # the MTP predictions' (their gradients
            _stamp(out, ctx.head.bwd, -1, mb)  # complete with the main pass's)
        _backward(out, ctx.head, -1, mb, emit)
    elif nxt:
        tag = _tag(mb, c, layout, grad=True)
        out.append(_p2p(Kind.RECV, "pp.recv.grad", mb, nxt, nbytes=ctx.p2p_bytes, tag=tag))
        _gather(out, "pp.gather.grad", Phase.BACKWARD, mb, ctx.gather_bytes)
    order = list(reversed(layers))
    for n, lay in enumerate(order):
        block = ctx.blocks[lay]
        if not ctx.recompute_beside or n == 0:
            _stamp(out, block.recompute, lay, mb)
        bwd: list[Instr] = []
        _backward(bwd, block, lay, mb, emit)
        if ctx.mtp is not None and lay >= ctx.main_layers:
            _stamp(bwd, ctx.mtp.bwd, lay, mb)
        if ctx.recompute_beside and n + 1 < len(order):
            # the next layer's recomputed forward needs only its saved input: it runs
            # beside this backward, each one's TP collectives under the other's compute
            rec: list[Instr] = []
            _stamp(rec, ctx.blocks[order[n + 1]].recompute, order[n + 1], mb)
            bwd = interleave_recompute(bwd, rec)
        out.extend(bwd)
    if first:
        _backward(out, ctx.embed, -1, mb, emit)
    elif prev:
        tag = _tag(mb, c - 1, layout, grad=True)
        out.append(_p2p(Kind.SEND, "pp.send.grad", mb, prev, nbytes=ctx.p2p_bytes, tag=tag))


def _neighbours(layout: Layout, stage: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per local chunk, the stage offsets of the previous and the next chunk.

    Round-robin chunks wrap around (the last stage's next chunk is on the first);
    in a V, chunk 0 goes down and chunk 1 comes back up, and the last stage hands
    one to the other itself (offset 0).
    """
    pp = layout.pp
    if layout.vshape:
        bottom = stage == pp - 1
        return (-1, 0 if bottom else 1), (0 if bottom else 1, -1)
    prev, nxt = (-1 if stage > 0 else pp - 1), (1 if stage < pp - 1 else 1 - pp)
    return (prev,) * layout.vp, (nxt,) * layout.vp


def _backward(out: list[Instr], block: Block, layer: int, mb: int, emit: Emit | None) -> None:
    if emit is None:
        _stamp(out, block.bwd, layer, mb)
        return
    ready = block.grad_ready
    for j, (kind, name, phase, work, coll, group, nbytes) in enumerate(block.bwd):
        out.append(Instr(kind, name, phase, layer, mb, work, coll, group, nbytes))
        pieces = ready.get(j)
        if pieces:
            emit(out, layer, mb, pieces)


def pipeline_message_bytes(dm: Dims, layout: Layout) -> tuple[float, float]:
    """Bytes each rank sends to the next stage, and the all-gather that rebuilds them.

    With sequence parallelism a rank holds ``T / tp`` tokens, and that is what it
    sends. Without it every rank of a TP group holds the whole activation, and
    Megatron-LM's scatter-gather optimization (arXiv 2104.04473, section 4.1) sends
    one ``1/tp`` slice per rank between stages and all-gathers the slices over the
    TP group's fast links on arrival, rather than sending the whole tensor ``tp``
    times over the slower inter-node links: ``(T h b / tp, T h b)``.
    """
    full = float(dm.sp_tokens * dm.hidden * ACT_BYTES)
    if layout.tp > 1 and not dm.sequence_parallel:
        return full / layout.tp, full
    return full, 0.0


def _gather(out: list[Instr], name: str, phase: str, mb: int, nbytes: float) -> None:
    if nbytes > 0:
        out.append(
            Instr(
                Kind.COLLECTIVE,
                name,
                phase,
                -1,
                mb,
                collective="all_gather",
                group="tp",
                nbytes=nbytes,
            )
        )


def _p2p(kind: Kind, name: str, mb: int, peer: int, *, nbytes: float, tag: int) -> Instr:
    # Activations travel to the next chunk, gradients back: tags are odd for gradients.
    phase = Phase.BACKWARD if tag % 2 else Phase.FORWARD
    return Instr(kind, name, phase, -1, mb, group="pp", nbytes=nbytes, peer=peer, tag=tag)


def _tag(mb: int, boundary: int, layout: Layout, *, grad: bool) -> int:
    """The tag of microbatch ``mb``'s message across the boundary after chunk ``boundary``.

    It is unique between two stages: ``2 mb + grad`` without interleaving.
    """
    return 2 * (mb * layout.vp + boundary // layout.pp) + grad


def adam_work(params: int, elem_bytes: int = 2) -> Work:
    """The Adam step over ``params`` parameters whose weights and gradients are
    ``elem_bytes`` each (``param_bytes``): ``ADAM_HBM_BYTES_PER_PARAM`` at 2."""
    hbm = ADAM_HBM_BYTES_PER_PARAM + 2 * (elem_bytes - 2)  # the gradient read, the weight written
    return Work(
        vector_ops=float(ADAM_VECTOR_OPS_PER_PARAM * params),
        scalar_ops=float(ADAM_SCALAR_OPS_PER_PARAM * params),
        hbm_bytes=float(hbm * params),
    )
