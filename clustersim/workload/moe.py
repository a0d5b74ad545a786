"""Mixture-of-experts layers: the MoE sublayer's op templates and its memory.

One MoE sublayer on one rank, per microbatch (T_s the rank's tokens: its sequence
shard under sequence parallelism; h hidden; E experts, k routed per token, E_l =
E / ep on this rank; f the expert width, f_l = f / etp on this rank):

1. ``mlp.norm``, then the router: the gate matmul (T_s, h, E) and the scoring
   (softmax over the experts, or DeepSeek-V3's sigmoid normalised over the
   chosen ones), top-k as k passes of max over the E scores;
2. ``moe.permute``: the k copies of each token gathered in expert order;
3. dispatch: an all-to-all over the EP group (``ep``), then under expert TP an
   all-gather of what arrived over ``etp``; with more than one local expert the
   all-to-all dispatcher then sorts what arrived (grouped by source rank) by local
   expert, ``moe.sort`` (Megatron-Core's ``sort_chunks_by_idxs``), and restores the
   order before the combine, ``moe.unsort``: a read and a write of each row, in
   the backward too (not under the hierarchical dispatcher, whose one permutation
   stands for DeepEP's). The hierarchical dispatcher (``moe.dispatcher``) sends
   each token across nodes once per destination node (``ep_cross``) and forwards
   every expert copy inside the node (``ep_node``); DeepEP forwards over NVLink what
   arrives over InfiniBand as it arrives, so the two overlap fully (arXiv 2412.19437
   section 3.2.2): the NVLink all-to-all starts with the InfiniBand one, without
   waiting, and is waited for after it, so the exchange takes the longer of the two
   with their flows sharing links and HBM (the first chunk's forwarding, the
   pipeline's fill, is not charged);
4. the experts as grouped GEMMs: E_l matmuls (t, h, 2 f_l) (gate and up, SwiGLU),
   the activation, E_l matmuls (t, f_l, h), where t is the tokens per local
   expert, padded up to the kernel's row tile (``ROW_TILE``): few tokens per
   expert waste the tile, and very few make each matmul latency-bound. Under FP8
   each grouped GEMM's input is quantized first, as for a dense linear (``ops``:
   the cast, after an amax pass under current scaling), and so is each output
   gradient before the backward; shared experts likewise;
5. combine: under expert TP a reduce-scatter over ``etp``, then the all-to-all
   back;
6. ``moe.unpermute``: the k expert outputs of each token weighted and summed;
7. shared experts (``moe.shared_experts``), a dense SwiGLU MLP of
   ``shared_experts * f`` split over TP like the dense MLP, and the residual.

The backward mirrors it: the all-to-alls carry the gradients the other way, the
grouped GEMMs run dgrad and wgrad. Expert weights' gradients are reduced over
the expert-data-parallel group (``edp``), the others over ``dp``.

The token loads and the busiest rank's routing are :mod:`clustersim.workload.moe_routing`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.catalog.schema import MoESpec
from clustersim.hardware.work import Work
from clustersim.workload.dims import Dims
from clustersim.workload.elementwise import activation_work
from clustersim.workload.elementwise import norm_work as _norm
from clustersim.workload.elementwise import residual_work as _residual
from clustersim.workload.moe_routing import (
    ROW_TILE,
    Routing,
    expert_loads,
    nodes_per_token,
    routing,
    stage_routing,
)
from clustersim.workload.ops import (
    ACT_BYTES,
    Part,
    Tpl,
    _casts,
    _Linear,
    only,
    without,
)
from clustersim.workload.program import Kind, Phase
from clustersim.workload.templates import coll as _coll
from clustersim.workload.templates import compute as _compute
from clustersim.workload.templates import twice as _twice
from clustersim.workload.tp_comm import TPComm

__all__ = [
    "ROW_TILE",
    "Routing",
    "dispatch_buffer_bytes",
    "expert_loads",
    "moe_activation_bytes",
    "moe_part",
    "nodes_per_token",
    "routing",
    "stage_routing",
]


def moe_part(dm: Dims, moe: MoESpec, route: Routing, precision: str) -> Part:
    """The MoE sublayer's templates (see the module doc)."""
    Ts, h, e, k = dm.sp_tokens, dm.hidden, moe.experts, moe.top_k
    tp = TPComm(dm)
    norm = _norm(dm, Ts)
    residual = _residual(Ts, h)
    gate = _Linear.of(Ts, h, e, "bf16" if precision == "fp8" else precision)
    scores = Ts * e
    if moe.scoring == "softmax":  # exp, then row max and row sum
        score_work = Work(scalar_ops=float(scores), vector_ops=float((2 + k) * scores))
    else:  # sigmoid, top-k, then the chosen scores normalised
        score_work = Work(scalar_ops=float(scores), vector_ops=float((1 + k) * scores + 2 * Ts * k))
    score_work = Work(
        scalar_ops=score_work.scalar_ops,
        vector_ops=score_work.vector_ops,
        hbm_bytes=float(4 * scores * 2),  # FP32 scores written and read back
    )
    copies = route.sent * h
    permute = Work(vector_ops=float(copies), hbm_bytes=float(2 * ACT_BYTES * copies))
    unpermute = Work(vector_ops=float(2 * copies), hbm_bytes=float(ACT_BYTES * (copies + Ts * h)))
    a2a = float(route.a2a_tokens * h * ACT_BYTES)
    node_a2a = float(route.node_tokens * h * ACT_BYTES)

    def exchange(phase: str, suffix: str) -> list[Tpl]:
        """The dispatch (or the combine) all-to-all: over ``ep``, or under the
        hierarchical dispatcher across nodes and inside them at once (module doc)."""
        if not node_a2a:
            return [_coll("ep", "all_to_all", phase, a2a, suffix)]
        inside = _coll("ep_node", "all_to_all", phase, a2a, suffix)
        return [
            (Kind.ASYNC_COLLECTIVE, *inside[1:]),
            _coll("ep_cross", "all_to_all", phase, node_a2a, suffix),
            (Kind.WAIT_ASYNC, f"{inside[1]}.wait", phase, None, "all_to_all", "ep_node", 0.0),
        ]

    etp = dm.etp
    gathered = float(route.received * etp * h * ACT_BYTES)
    t, n_e = route.expert_rows, route.local_experts
    f_l = moe.expert_ffn_hidden // etp
    up_cols = (2 if dm.swiglu else 1) * f_l
    up = _grouped(t, h, up_cols, n_e, precision)
    down = _grouped(t, f_l, h, n_e, precision)
    act = activation_work(t * n_e * f_l, dm.swiglu)
    ep_on, etp_on = route.local_experts < e, etp > 1
    shared = _shared(dm, moe, precision)
    cast = _casts(precision, dm.fp8_scaling)  # FP8 quantization of each GEMM's input
    rows = t * n_e
    s_cols = moe.shared_experts * moe.expert_ffn_hidden // dm.tp
    s_up_cols = (2 if dm.swiglu else 1) * s_cols
    # The all-to-all dispatcher's chunk sort: what arrived, in source-rank order, regrouped
    # by local expert (and back before the combine); a read and a write of each row.
    sorted_elems = route.received * etp * h
    sort = (
        Work(vector_ops=float(sorted_elems), hbm_bytes=float(2 * ACT_BYTES * sorted_elems))
        if ep_on and n_e > 1 and not node_a2a
        else None
    )

    def forward(phase: str) -> list[Tpl]:
        out = [
            _compute("mlp.norm", phase, norm),
            _compute("moe.router", phase, gate.fwd),
            _compute("moe.router.scores", phase, score_work),
            _compute("moe.permute", phase, permute),
        ]
        if ep_on:
            out += exchange(phase, ".dispatch")
        if etp_on:
            out.append(_coll("etp", "all_gather", phase, gathered))
        if sort is not None:
            out.append(_compute("moe.sort", phase, sort))
        out += [
            *cast("moe.experts.up", phase, rows, h),
            _compute("moe.experts.up", phase, up.fwd),
            _compute("moe.experts.act", phase, act),
            *cast("moe.experts.down", phase, rows, f_l),
            _compute("moe.experts.down", phase, down.fwd),
        ]
        if sort is not None:
            out.append(_compute("moe.unsort", phase, sort))
        if etp_on:
            out.append(_coll("etp", "reduce_scatter", phase, gathered))
        if ep_on:
            out += exchange(phase, ".combine")
        out.append(_compute("moe.unpermute", phase, unpermute))
        out += shared_fwd(phase)
        out.append(_compute("mlp.residual", phase, residual))
        return out

    def shared_fwd(phase: str) -> list[Tpl]:
        if shared is None:
            return []
        s_up, s_act, s_down = shared
        return [
            *tp.enter_fwd(phase),
            *cast("moe.shared.up", phase, dm.tokens, h),
            _compute("moe.shared.up", phase, s_up.fwd),
            _compute("moe.shared.act", phase, s_act),
            *cast("moe.shared.down", phase, dm.tokens, s_cols),
            _compute("moe.shared.down", phase, s_down.fwd),
            *tp.exit_fwd(phase),
        ]

    B = Phase.BACKWARD
    bwd: list[Tpl] = []
    ready: dict[int, tuple[str, ...]] = {}

    def mark(piece: str) -> None:
        ready[len(bwd) - 1] = (piece,)

    bwd.append(_compute("mlp.residual", B, _twice(residual)))
    if shared is not None:
        s_up, s_act, s_down = shared
        bwd += [
            *tp.exit_bwd(),
            *cast("moe.shared.down.grad", B, dm.tokens, h),
            _compute("moe.shared.down.dgrad", B, s_down.dgrad),
            _compute("moe.shared.down.wgrad", B, s_down.wgrad),
        ]
        mark("moe.shared.down")
        bwd += [
            _compute("moe.shared.act", B, _twice(s_act)),
            *cast("moe.shared.up.grad", B, dm.tokens, s_up_cols),
            _compute("moe.shared.up.dgrad", B, s_up.dgrad),
            _compute("moe.shared.up.wgrad", B, s_up.wgrad),
        ]
        mark("moe.shared.up")
        bwd += tp.enter_bwd()
    bwd.append(_compute("moe.unpermute", B, _twice(unpermute)))
    if ep_on:  # the combine's gradient goes the dispatch's way
        bwd += exchange(B, ".combine")
    if etp_on:
        bwd.append(_coll("etp", "all_gather", B, gathered))
    if sort is not None:
        bwd.append(_compute("moe.unsort", B, sort))
    bwd += cast("moe.experts.down.grad", B, rows, h)
    bwd += [
        _compute("moe.experts.down.dgrad", B, down.dgrad),
        _compute("moe.experts.down.wgrad", B, down.wgrad),
    ]
    mark("moe.experts.down")
    bwd += [
        _compute("moe.experts.act", B, _twice(act)),
        *cast("moe.experts.up.grad", B, rows, up_cols),
        _compute("moe.experts.up.dgrad", B, up.dgrad),
        _compute("moe.experts.up.wgrad", B, up.wgrad),
    ]
    mark("moe.experts.up")
    if sort is not None:
        bwd.append(_compute("moe.sort", B, sort))
    if etp_on:
        bwd.append(_coll("etp", "reduce_scatter", B, gathered))
    if ep_on:
        bwd += exchange(B, ".dispatch")
    bwd += [
        _compute("moe.permute", B, _twice(permute)),
        _compute("moe.router.scores", B, _twice(score_work)),
        _compute("moe.router.dgrad", B, gate.dgrad),
        _compute("moe.router.wgrad", B, gate.wgrad),
    ]
    mark("moe.router")
    bwd.append(_compute("mlp.norm", B, _twice(norm)))
    mark("mlp.norm")
    pieces = {
        "layernorm": only(forward, "mlp.norm"),
        "moe": without(forward, "mlp.norm", "mlp.residual"),  # the MoELayer module
        "moe_act": only(forward, "moe.experts.act"),
        "shared_experts": shared_fwd,
    }
    return Part(forward, tuple(bwd), ready, pieces=pieces)


@dataclass(frozen=True)
class _Grouped:
    fwd: Work
    dgrad: Work
    wgrad: Work


def _grouped(t: int, k: int, n: int, experts: int, precision: str) -> _Grouped:
    """A grouped GEMM: ``experts`` matmuls (t, k, n), as one op per pass."""
    op = 1 if precision == "fp8" else ACT_BYTES
    rows = t * experts
    w = k * n * experts
    return _Grouped(
        fwd=Work(
            (t, k, n),
            experts,
            precision,
            hbm_bytes=float(op * (rows * k + w) + ACT_BYTES * rows * n),
        ),
        dgrad=Work(
            (t, n, k),
            experts,
            precision,
            hbm_bytes=float(op * (rows * n + w) + ACT_BYTES * rows * k),
        ),
        wgrad=Work(
            (k, t, n),
            experts,
            precision,
            hbm_bytes=float(op * (rows * k + rows * n) + 2 * ACT_BYTES * w),
        ),
    )


def _shared(dm: Dims, moe: MoESpec, precision: str) -> tuple[_Linear, Work, _Linear] | None:
    if not moe.shared_experts:
        return None
    T = dm.tokens
    fs = moe.shared_experts * moe.expert_ffn_hidden // dm.tp
    up_cols = (2 if dm.swiglu else 1) * fs
    return (
        _Linear.of(T, dm.hidden, up_cols, precision),
        activation_work(T * fs, dm.swiglu),
        _Linear.of(T, fs, dm.hidden, precision),
    )


def moe_activation_bytes(
    dm: Dims,
    moe: MoESpec,
    route: Routing,
    recompute: str,
    modules: frozenset[str] = frozenset({"core_attn"}),
) -> int:
    """Bytes one MoE sublayer keeps for its backward, per microbatch, on one rank.

    As Megatron-Core 0.14's MoE layer with grouped GEMMs keeps them, with l B per
    element of a linear's saved input (``Dims.saved_input_bytes``): the norm's input
    and output (2 x 2*T_s*h; the router keeps the output in BF16), the FP32 router
    scores (4*T_s*E), the experts' input rows (l*R*h for R padded rows), their
    gate-and-up outputs (2*R*2f_l, the activation's input) and the down-projection's
    input (l*R*f_l), and the shared experts' like a dense MLP (with, under FP8, their
    up-projection's copy of the input, l*T_s*h). The routing probabilities are applied
    in the experts' activation (``TEGroupedMLP``), so the combine keeps no tokens.

    Selective ``modules`` (``workload.recompute``): ``layernorm`` does not keep the
    norm's output, ``moe`` keeps only it (the layer's checkpoint input), ``moe_act``
    not the down-projection's input, ``shared_experts`` nothing of the shared experts.
    Full recompute keeps none of it (the caller counts the layer's input).
    """
    if recompute == "full":
        return 0
    mods = modules if recompute == "selective" else frozenset()
    Ts, h, lin = dm.sp_tokens, dm.hidden, dm.saved_input_bytes
    total = 2 * Ts * h
    if "moe" in mods:
        return total + 2 * Ts * h
    if "layernorm" not in mods:
        total += 2 * Ts * h
    f_l = moe.expert_ffn_hidden // dm.etp
    rows = route.expert_rows * route.local_experts
    up = (2 if dm.swiglu else 1) * f_l
    total += 4 * Ts * moe.experts + rows * (lin * h + 2 * up)
    if "moe_act" not in mods:
        total += lin * rows * f_l
    if moe.shared_experts and "shared_experts" not in mods:
        fs = moe.shared_experts * moe.expert_ffn_hidden // dm.tp
        total += 2 * dm.tokens * (2 if dm.swiglu else 1) * fs + lin * dm.tokens * fs
        if lin < 2:
            total += lin * Ts * h
    return total


def dispatch_buffer_bytes(dm: Dims, route: Routing) -> int:
    """The all-to-all's send and receive buffers of the layer in flight (transient)."""
    return int(2 * route.a2a_tokens * dm.hidden * ACT_BYTES)
