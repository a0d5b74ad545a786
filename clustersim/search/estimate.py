"""A fast analytic estimate of one training step: milliseconds per layout, no simulation.

The estimate uses the same pieces as the simulator, but adds them up in closed form:

- **Compute.** The op templates of one transformer layer, the embedding and the
  LM head (``workload.ops``) are timed on the chip's pipelined roofline
  (``ChipModel.op_time``), once per layout; a stage's forward and backward per
  microbatch are those times times its layers.
- **Collectives** (TP and CP inside the layers, DP gradient reduction, the ZeRO-1
  parameter all-gather) use the alpha-beta cost of dimension-ordered rings
  (Thakur, Rabenseifner & Gropp 2005; ``network/collectives/algorithms/torus.py``): the group
  is cut into levels, inner first (the ranks of one chip, the chips of an
  instance along each torus axis, the instances of an UltraServer, the
  scale-up domains over EFA), and level k with d_k members moves
  ``(d_k-1)/d_k · m_k`` bytes, ``m_k`` being what is left after the inner
  levels, over its bottleneck bandwidth: the link's capacity (twice that for a
  bidirectional ring of three or more) divided among the flows that share it
  (every rank of a chip runs the same collective at once). Latency is
  ``(d_k-1) a_k`` for rings, ``log2 p · a`` for halving-doubling and ``a`` for
  a mesh, by the runtime's size rule. A group that is no grid on a torus runs
  one flat ring, priced on its busiest link (``search/flatring.py``). The
  runtime's fixed costs are added as the
  simulator adds them (``network/runtimes/costs.py``): on Trainium a launch, a handshake per
  halving-doubling or mesh round and a ring's own per ring step (across scale-up
  domains one ring through each domain's ranks from 1 MB up, as ``hierarchical``
  runs it), a posting cost per message and per round over EFA, and
  halving-doubling messages no faster than their DMA queues; on
  GPUs NCCL's choice of algorithm and protocol and its latency (``network/runtimes/nccl.py``).
  Sharing a link slows only the bytes on it, not those fixed costs.
- **Compute** follows the scenario's attention kernel (``parallelism.attention``,
  ``cp_comm_type``), precision and recompute, through the same op templates as the
  simulator; the CP ring's transfers count only where they outlast the attention
  steps they overlap (plus the SMs they take from them). A full recompute that runs
  beside the backward of the layer after it (the ``dataflow`` TP rule) saves, per
  pair of layers, the communication the interleaving hides (``search.beside``).
- **Pipeline.** With m microbatches, pp stages and v model chunks per stage
  (interleaved 1F1B when v > 1) the step is
  ``sum_s (F_s + B_s) / v + (m - 1/v) max_s (F_s + B_s)`` plus the point-to-point
  hops: its bubble is ``(pp - 1)/(v m + pp - 1)`` of the step when stages are
  equal. Then what of each stage's DP gradient reduction is still queued when
  the last microbatch's backward ends (each bucket starts when its last gradient
  is ready, ``search/buckets.py``), the Adam step, and the ZeRO-1 all-gather (with
  ``overlap_param_gather``, its first bucket and what the forwards cannot hide).
- **SMs** (GPUs: ``collective_sm_fraction``). While the gradient reduction, ZeRO-1's
  overlapped gather or ZeRO-2/3's collectives are in flight under compute, that
  compute runs at ``1 - f`` of its speed, as the simulator caps it: the pass loses
  ``f`` of the overlapped time (``interference_s``).
- **Host** (``software.host_op_s``). A step is no shorter than the busiest stage's
  ops, counted from the same templates, issued one after another by the host.

Contention between different collectives running at once, and the network's
max-min sharing, are left to the simulation of the best candidates.
"""

from __future__ import annotations

from clustersim.catalog.schema import ModelSpec
from clustersim.hardware.chip import ChipModel
from clustersim.hardware.work import Work
from clustersim.scenario import Resolved
from clustersim.scenario.models import MoECfg, ParallelismCfg, TrainingCfg
from clustersim.search.beside import pairs_beside, stage_saved_s
from clustersim.search.buckets import block_readies, grad_tail_s
from clustersim.search.drain import (
    hop_shared_s,
    op_ready_times,
    shared_backward_s,
)
from clustersim.search.experts import grad_streams_s, layer_kinds
from clustersim.search.netmodel import Level, NetModel, collective_s, collective_wire_s
from clustersim.search.parts import Blocks, Estimate, blocks_times
from clustersim.search.pipeline import last_backward_ends
from clustersim.search.sharded import (
    bucket_streams,
    dp_tail,
    flat_ring_tiers,
    unit_streams,
)
from clustersim.search.sharded_pass import sharded_pass_s
from clustersim.search.templates_time import sm_lost_s, templates_s
from clustersim.workload import (
    Layout,
    first_chunk_buckets,
    make_dims,
    make_layout,
    microbatches,
    model_flops_per_step,
    validate,
)
from clustersim.workload.dims import (
    optimizer_params,
    stage_layers,
)
from clustersim.workload.ends import embed_block, head_block
from clustersim.workload.gradbuckets import param_bytes
from clustersim.workload.layers import LayerBlocks, bf16_layer_count, moe_sublayer
from clustersim.workload.ops import Tpl
from clustersim.workload.overlap import a2a_overlap, recompute_beside
from clustersim.workload.program import Kind
from clustersim.workload.recompute import modules_of
from clustersim.workload.titan import lowering_of
from clustersim.workload.transformer import adam_work, pipeline_message_bytes

__all__ = [
    "Estimate",
    "Estimator",
    "Level",
    "NetModel",
    "collective_s",
    "estimate",
    "estimate_resolved",
]


class Estimator:
    """Estimates layouts of one model, batch and cluster; caches what layouts share.

    Op times depend only on the op's ``Work``; block times only on (tp, cp,
    microbatch size, recompute); collective levels only on the group's stride and size,
    and a collective's time on those, its op and its bytes.
    """

    def __init__(
        self,
        model: ModelSpec,
        train: TrainingCfg,
        chip: ChipModel,
        net: NetModel,
        *,
        moe: MoECfg | None = None,
        seed: int = 0,
        lowering: str = "fused",
        host_op_s: float = 0.0,
    ):
        self.model, self.train, self.chip, self.net = model, train, chip, net
        self.moe, self.seed, self.lowering = moe, seed, lowering
        self.host_op_s = host_op_s
        """The host's time to issue one op (``software.host_op_s``): a rank's step is
        no shorter than its ops issued one after another."""
        self._work: dict[Work, float] = {}
        self._blocks: dict[tuple[int, ...] | tuple[object, ...], Blocks] = {}
        self._levels: dict[tuple[int, int], tuple[list[Level], int]] = {}
        self._colls: dict[tuple[int, int, str, float], float] = {}
        self.memo: dict[tuple[object, ...], float] = {}  # ``search.drain``'s
        self.flops_per_step = model_flops_per_step(model, train)

    def work_s(self, work: Work) -> float:
        found = self._work.get(work)
        if found is None:
            found = self._work[work] = self.chip.op_time(work).seconds
        return found

    def coll_s(self, stride: int, size: int, op: str, nbytes: float) -> float:
        found = self._colls.get((stride, size, op, nbytes))
        if found is not None:
            return found
        key = (stride, size)
        if key not in self._levels:
            self._levels[key] = self.net.levels(stride, size)
        levels, sharing = self._levels[key]
        if not levels or nbytes <= 0:
            found = 0.0
        elif (ring := self.net.flat_ring(stride, size, op, nbytes)) is not None:
            found = self.net.flat_ring_s(ring, op, nbytes)[0]
        else:
            found = collective_s(op, nbytes, levels, sharing, self.net.runtime)
        self._colls[(stride, size, op, nbytes)] = found
        return found

    def wire_s(self, stride: int, size: int, op: str, nbytes: float) -> float:
        """The part of :meth:`coll_s` the bytes spend on the links, which is what another
        collective on those links slows (the runtime's fixed costs hold no link)."""
        self.coll_s(stride, size, op, nbytes)
        levels, sharing = self._levels[(stride, size)]
        ring = self.net.flat_ring(stride, size, op, nbytes) if levels and nbytes > 0 else None
        if ring is not None:
            return self.net.flat_ring_s(ring, op, nbytes)[1]
        return collective_wire_s(op, nbytes, levels, sharing, self.net.runtime)

    def contended_s(self, stride: int, size: int, op: str, nbytes: float) -> float:
        """The seconds a collective of the same size on the same links at once adds to
        one (:meth:`wire_s`, less where DMA queues bound its messages)."""
        levels, sharing = self.net.levels(stride, size)
        if not levels or nbytes <= 0 or self.net.flat_ring(stride, size, op, nbytes) is not None:
            return self.wire_s(stride, size, op, nbytes)
        return collective_wire_s(op, nbytes, levels, sharing, self.net.runtime, together=2)

    def tiers(self, stride: int, size: int) -> set[str]:
        """The tiers of links (``Level.tier``) a group's levels, or its flat ring, cross."""
        tiers = {lv.tier for lv in self.net.levels(stride, size)[0]}
        return tiers | flat_ring_tiers(self.net.torus, stride, size)

    def _tpls_s(self, tpls: tuple[Tpl, ...], layout: Layout) -> tuple[float, float]:
        sm = self.chip.spec.collective_sm_fraction
        return templates_s(tpls, layout, self.work_s, self.coll_s, sm)

    def blocks(self, par: ParallelismCfg, layout: Layout) -> Blocks:
        sizes = (layout.tp, layout.cp, layout.dp, layout.ep, layout.etp, par.microbatch_size)
        rec_modules = modules_of(par)
        opts = (par.recompute, rec_modules, par.sequence_parallel, par.attention, par.cp_comm_type)
        key = (*sizes, *opts, par.tp_comm_overlap, par.zero >= 3)  # recompute_beside's
        found = self._blocks.get(key)
        if found is None:
            dm = make_dims(self.model, par, self.train, layout)
            moe = moe_sublayer(self.model, par, self.train, layout, cfg=self.moe, seed=self.seed)
            prec, rec_kind = self.train.precision, par.recompute
            blocks = LayerBlocks(
                self.model,
                dm,
                precision=prec,
                recompute=rec_kind,
                modules=rec_modules,
                attention=par.attention,
                moe_part=moe,
                bf16_layers=self.train.fp8.bf16_layers,
                lowering=self.lowering,  # ``workload.titan``
            )
            layer = blocks.dense
            bf16 = blocks.bf16 if blocks.bf16 is not None else layer
            bf16_bwd = self._tpls_s(bf16.bwd, layout)
            bf16_rec = self._tpls_s(bf16.recompute, layout)
            expert = blocks.moe if blocks.moe is not None else layer
            embed, head = embed_block(dm), head_block(dm)
            bwd = self._tpls_s(layer.bwd, layout)
            rec = self._tpls_s(layer.recompute, layout)
            moe_bwd = self._tpls_s(expert.bwd, layout)
            moe_rec = self._tpls_s(expert.recompute, layout)
            named = {"dense": layer, "moe": expert, "bf16": bf16}
            sm = self.chip.spec.collective_sm_fraction
            kinds = {k: b for k, b in named.items() if k == "dense" or b is not layer}
            pairs = (
                pairs_beside(kinds, layout, self.work_s, self, sm_fraction=sm)
                if recompute_beside(par, dm)
                else {}
            )
            found = self._blocks[key] = Blocks(
                layer_fwd=self._tpls_s(layer.fwd, layout),
                layer_bwd=(bwd[0] + rec[0], bwd[1] + rec[1]),
                moe_fwd=self._tpls_s(expert.fwd, layout),
                moe_bwd=(moe_bwd[0] + moe_rec[0], moe_bwd[1] + moe_rec[1]),
                embed_fwd=self._tpls_s(embed.fwd, layout),
                embed_bwd=self._tpls_s(embed.bwd, layout),
                head_fwd=self._tpls_s(head.fwd, layout),
                head_bwd=self._tpls_s(head.bwd, layout),
                p2p_bytes=pipeline_message_bytes(dm, layout)[0],
                p2p_gather_s=self.coll_s(
                    1, layout.tp, "all_gather", pipeline_message_bytes(dm, layout)[1]
                ),
                layer_fwd_comms=self._comm_times(layer.fwd, layout),
                layer_bwd_comms=self._comm_times((*layer.recompute, *layer.bwd), layout),
                bf16_fwd=self._tpls_s(bf16.fwd, layout),
                bf16_bwd=(bf16_bwd[0] + bf16_rec[0], bf16_bwd[1] + bf16_rec[1]),
                ready=block_readies(
                    {**named, "embed": embed, "head": head},
                    lambda t: self._tpls_s(t, layout),
                ),
                beside=pairs,
                ops={
                    k: len(b.fwd) + len(b.recompute) + len(b.bwd)
                    for k, b in {**named, "embed": embed, "head": head}.items()
                },
            )
        return found

    def _comm_times(self, tpls: tuple[Tpl, ...], layout: Layout) -> tuple[tuple[float, float], ...]:
        """(start, seconds on the links) of each collective of ``tpls``, in order."""
        out: list[tuple[float, float]] = []
        t = 0.0
        for tpl in tpls:
            comp, comm = self._tpls_s((tpl,), layout)
            kind, _, _, _, coll, group, nbytes = tpl
            if comm > 0 and kind == Kind.COLLECTIVE:
                stride, size = (1, layout.tp) if group == "tp" else (layout.tp, layout.cp)
                out.append((t, self.wire_s(stride, size, coll, nbytes)))
            t += comp + comm
        return tuple(out)

    def p2p_s(self, layout: Layout, nbytes: float) -> float:
        """One pipeline hop: every rank of a chip sends to the next stage at once."""
        levels, sharing = self.net.levels(layout.ranks_per_stage, 2)
        if not levels:
            return 0.0
        lv = levels[-1]
        flows = sharing * (levels[0].size if levels[0].shared_link else 1)
        return lv.latency_s + nbytes * flows / lv.bw_Bps

    def __call__(self, par: ParallelismCfg, layout: Layout) -> Estimate:
        """The analytic step time of a (validated) layout; see the module doc."""
        model = self.model
        blk = self.blocks(par, layout)
        n_mb = microbatches(par, self.train, layout)
        pp = layout.pp
        p2p = self.p2p_s(layout, blk.p2p_bytes) + blk.p2p_gather_s if pp > 1 else 0.0
        fwd: list[float] = []
        bwd: list[float] = []
        comp: list[float] = []
        comm: list[float] = []
        once: list[float] = []  # ZeRO-3's gathers and reduce-scatters once per step
        in_flight: list[tuple[float, float]] = []  # ZeRO-2/3's collectives per microbatch
        stepped: list[tuple[float, float] | None] = []  # ZeRO-3's SM losses, stepped
        passes: list[tuple[float, float, float, float]] = []
        sharded_mb = lost_mb = host_s = 0.0
        sm = self.chip.spec.collective_sm_fraction
        for stage in range(pp):
            layers = stage_layers(model, layout, stage)
            n, e = layer_kinds(model, layers)
            k = bf16_layer_count(model, self.train, layers)  # dense layers kept in BF16
            n -= k
            f_comp = n * blk.layer_fwd[0] + e * blk.moe_fwd[0] + k * blk.bf16_fwd[0]
            f_comm = n * blk.layer_fwd[1] + e * blk.moe_fwd[1] + k * blk.bf16_fwd[1]
            b_comp = n * blk.layer_bwd[0] + e * blk.moe_bwd[0] + k * blk.bf16_bwd[0]
            b_comm = n * blk.layer_bwd[1] + e * blk.moe_bwd[1] + k * blk.bf16_bwd[1]
            if blk.beside:  # each recompute beside the backward of the layer after it
                b_comm -= stage_saved_s((model, self.train, layout), stage, blk.beside)
            if stage == 0:
                f_comp, f_comm = f_comp + blk.embed_fwd[0], f_comm + blk.embed_fwd[1]
                b_comp, b_comm = b_comp + blk.embed_bwd[0], b_comm + blk.embed_bwd[1]
            if stage == pp - 1:
                f_comp, f_comm = f_comp + blk.head_fwd[0], f_comm + blk.head_fwd[1]
                b_comp, b_comm = b_comp + blk.head_bwd[0], b_comm + blk.head_bwd[1]
            mb = (f_comp, f_comm, b_comp, b_comm)
            passes.append(mb)
            if self.host_op_s:
                ops = blk.ops
                n_ops = n * ops["dense"] + e * ops["moe"] + k * ops["bf16"]
                n_ops += (ops["embed"] if stage == 0 else 0) + (
                    ops["head"] if stage == pp - 1 else 0
                )
                host_s = max(host_s, n_mb * n_ops * self.host_op_s)
            f_fsdp, b_fsdp = sharded_pass_s(
                self,
                par,
                layout,
                stage,
                blk,
                mb=mb,
                once=once,
                in_flight=in_flight,
                sm_lost=stepped,
            )
            # The sharded collectives in flight while the pass computes take SMs.
            f_sm = sm_lost_s(sm, in_flight[-1][0] - f_fsdp, f_comp, f_comm)
            b_sm = sm_lost_s(sm, in_flight[-1][1] - b_fsdp, b_comp, b_comm)
            f_sm, b_sm = stepped[-1] or (f_sm, b_sm)
            fwd.append(f_comp + f_comm + f_fsdp + f_sm)
            bwd.append(b_comp + b_comm + b_fsdp + b_sm)
            comp.append(f_comp + b_comp)
            comm.append(f_comm + b_comm)
            sharded_mb += n_mb * (f_fsdp + b_fsdp) / pp
            lost_mb += n_mb * (f_sm + b_sm) / pp
        per_mb = [f + b for f, b in zip(fwd, bwd, strict=True)]
        hops = 2 * (pp - 1) * p2p
        # Interleaved 1F1B (v model chunks per stage): the fill and drain take one
        # chunk's time per stage, (pp - 1)/v slots instead of pp - 1.
        vp = layout.vp
        pipeline = sum(per_mb) / vp + (n_mb - 1 / vp) * max(per_mb) + hops
        # After each stage's last backward: its gradient reduction, the Adam step, the
        # ZeRO-1 gather.
        tails: list[tuple[float, float, float]] = []
        extra: list[float] = []  # what slows each stage's last backward
        sm_last: list[float] = []  # the part of it the SMs take
        hop_extra = [0.0] * pp  # the part that delays its last hop back
        bucket = par.grad_bucket_bytes
        for stage in range(pp):
            dp_s, gather, first_bucket, streams = grad_streams_s(
                model, layout, stage, par, self.coll_s, elem_bytes=param_bytes(self.train)
            )
            exposed = 0.0
            if dp_s > 0 and par.zero < 2:
                # The buckets still queued when the last backward ends (``search.buckets``).
                exposed = grad_tail_s(
                    (model, self.train, par, layout),
                    stage,
                    blk.ready,
                    [group for group, _ in streams],
                    coll_s=self.coll_s,
                )
            f_comp, f_comm, b_comp, b_comm = passes[stage]
            # The reduction in flight under the last backward takes SMs (ZeRO-2 and 3:
            # counted per microbatch above).
            extra.append(0.0)
            sm_last.append(0.0)
            lost = 0.0
            if par.zero < 2 and dp_s > 0 and par.overlap_grad_reduce:
                # The reduction in flight takes SMs, and TP links (``search.drain``).
                sm_last[-1] = sm_lost_s(sm, min(dp_s, bwd[stage]), b_comp, b_comm)
                extra[-1] = sm_last[-1] + shared_backward_s(
                    self,
                    layout,
                    stage,
                    zero=par.zero,
                    bucket_bytes=bucket,
                    ready=blk.ready,
                    # beside the next recompute, what the layer waits for of them
                    layer_comms=blk.beside[("dense", "dense")].comms
                    if blk.beside
                    else blk.layer_bwd_comms,
                    first_only=first_chunk_buckets(par),
                )
                hop_x = hop_shared_s(
                    self,
                    layout,
                    nbytes=blk.p2p_bytes if stage else 0.0,
                    tail_s=exposed,
                    streams=streams,
                    op="reduce_scatter" if par.zero == 1 else "all_reduce",
                    # one bucket per model chunk past the first stage (Megatron-Core)
                    bucket_bytes=bucket
                    if stage == 0 or not first_chunk_buckets(par)
                    else max(b for _, b in streams) / layout.vp,
                )
                extra[-1] += hop_x  # the stage before waits for it (not this one)
                hop_extra[stage] = hop_x
            opt_params = optimizer_params(model, layout, stage, par.zero)
            opt_s = self.work_s(adam_work(opt_params, param_bytes(self.train)))
            if par.zero == 1 and par.overlap_param_gather and gather > 0:
                # Under the forward: the first bucket blocks, the rest hide behind
                # the stage's forwards (see workload.transformer).
                first = self.coll_s(*streams[0][0], "all_gather", first_bucket)
                hidden = min(gather - first, n_mb * fwd[stage])
                lost += sm_lost_s(sm, hidden, n_mb * f_comp, n_mb * f_comm)
                gather = gather - hidden
            if par.zero >= 2 and layout.dp * layout.cp > 1:
                # The dense stream over dp_shard; an MoE model's experts over their
                # shard group (edp, or edp_shard under hybrid sharding).
                times = blocks_times(blk)
                if par.zero == 3:
                    grads = unit_streams(model, par, layout, stage, times)
                else:
                    at = op_ready_times(self, layout, stage, blk.ready)
                    grads = bucket_streams(model, layout, stage, bucket, times, op_ready=at)
                exposed, gather = dp_tail(
                    par,
                    layout,
                    grads,
                    last_bwd_s=bwd[stage],
                    coll_s=self.coll_s,
                    wire_s=self.wire_s,
                )
                exposed += once[stage] if par.zero == 3 else 0.0
                if par.zero == 2 and layout.replicas == 1:
                    # The last microbatch reduce-scatters ZeRO-1's buckets, over
                    # dp_shard: each queued from the op that completes it, so an
                    # MoE model's expert buckets are done before the embedding's.
                    zero1 = (model, self.train, par.model_copy(update={"zero": 1}), layout)
                    groups = [g.group for g in grads]
                    exposed = grad_tail_s(zero1, stage, blk.ready, groups, coll_s=self.coll_s)
            tails.append((exposed + gather, opt_s, lost))
        if par.schedule == "1f1b" and vp == 1 and pp > 1 and not a2a_overlap(par, model, layout):
            last = last_backward_ends(fwd, bwd, p2p, n_mb, extra)  # ``search.pipeline``
            pipeline = last[0] - extra[0]
        else:  # each stage ends its last backward earlier than stage 0 by those before it
            offsets = [sum(bwd[k] / vp + p2p for k in range(s)) for s in range(pp)]
            last = [pipeline - offsets[s] + extra[s] for s in range(pp)]
        ends = [b - h + sum(t) for b, h, t in zip(last, hop_extra, tails, strict=True)]
        step = max(*ends, host_s)  # a host slower than the device sets the step
        peak = self.chip.peak_flops(self.train.precision) * layout.chips
        sends = 2 * n_mb * p2p if pp > 1 else 0.0
        bubble = sum(max(pipeline - n_mb * t - sends, 0.0) for t in per_mb)
        return Estimate(
            step_time_s=step,
            compute_s=n_mb * sum(comp) / pp,
            comm_s=n_mb * sum(comm) / pp + sends,
            bubble_s=bubble / pp,
            dp_exposed_s=sum(t[0] for t in tails) / pp + sharded_mb,
            optimizer_s=sum(t[1] for t in tails) / pp,
            mfu=self.flops_per_step / (step * peak) if step > 0 else 0.0,
            interference_s=lost_mb + (sum(t[2] for t in tails) + sum(sm_last)) / pp,
        )


def estimate(
    model: ModelSpec,
    par: ParallelismCfg,
    *,
    train: TrainingCfg,
    layout: Layout,
    chip: ChipModel,
    net: NetModel,
) -> Estimate:
    """The analytic step time of one (validated) layout; see the module doc."""
    return Estimator(model, train, chip, net)(par, layout)


def estimate_resolved(res: Resolved) -> Estimate:
    """The analytic step time of a resolved scenario's own layout."""
    sc = res.scenario
    layout = make_layout(sc.parallelism, res.ranks, res.ranks_per_chip, res.ranks_per_node)
    validate(res.model, sc.parallelism, sc.training, layout)
    chip = ChipModel(res.chip, res.lnc)
    net = NetModel.of(res.instance, res.chip, sc.cluster.count, res.lnc)
    lowering = lowering_of(sc.software.compile, res.software.compile)
    host = sc.software.host_op_s or 0.0
    est = Estimator(res.model, sc.training, chip, net, lowering=lowering, host_op_s=host)
    return est(sc.parallelism, layout)
