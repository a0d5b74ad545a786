"""Lowering of one transformer layer into op templates (the embedding and the LM head:
``workload.ends``).

Every distinct ``Work`` is built once here and shared by all layers and
microbatches (the simulator caches op durations per ``Work`` object). A
``Block`` holds instruction templates for the forward, the recompute and the
backward pass; ``transformer`` stamps them out with a layer and a microbatch.

Cost model, per rank (T = b*s/cp matmul rows, T_sp = T/tp with sequence
parallelism, h hidden, a/g heads and KV heads per rank, d head dim, f MLP width
per rank, V vocabulary per rank):

- Linear layer (m, k, n) = (T, in, out): 2mkn FLOPs forward. Backward is a dgrad
  (m, n, k) and a wgrad (k, m, n). HBM: forward reads X and W and writes Y;
  dgrad reads dY and W and writes dX; wgrad reads X and dY and reads and writes
  the bf16 gradient accumulator. Operands are 1 byte under FP8, else 2.
- Attention core (flash attention, causal): per sequence and local head, QK^T is
  (s/cp, d, s/2) and PV (s/cp, s/2, d): the causal mask halves the useful key
  length (an encoder's, ``model.causal: false``, is the whole s). Scores never
  reach HBM; the core reads Q, K, V and writes O and the FP32 log-sum-exp.
  Softmax is one exp (scalar engine) and a row max and a row sum (vector engine)
  per score. Flash attention's backward recomputes the
  scores, so it runs five matmuls of the forward's size: S = QK^T and
  dP = dO V^T, then dQ, then dK and dV.
- Unfused attention (``parallelism.attention: unfused``, Megatron-LM before flash
  attention): QK^T and PV run over the whole s x s square (the causal mask is
  applied to the scores, not skipped), and the bf16 scores and probabilities go
  through HBM: QK^T writes the scores, a fused scale-mask-softmax reads them and
  writes the probabilities, and PV reads them (8 bytes per score); with the
  model's ``attention_dropout`` (GPT-3's 0.1; Llama's 0) a dropout kernel reads
  the probabilities and writes them with a one-byte mask (11 bytes per score).
  The backward reads the saved probabilities: dP = dO V^T (written), dV = P^T dO,
  the softmax (and dropout) backward (reads dP, the mask if any and the
  probabilities, writes dS), then dQ = dS K and dK = dS^T Q.
- Norms: 3 vector ops per element for RMSNorm (square-sum, scale, weight), 5
  for LayerNorm, one scalar rsqrt per row; HBM reads and writes the activation.
- Elementwise backward costs twice its forward (engine ops and HBM bytes): it
  reads the saved input and the output gradient and writes the input gradient.
  Each elementwise op is one kernel (``elementwise``); under torchtitan a dense
  Llama block runs PyTorch's eager kernels or Inductor's fused ones instead, and w1
  and w3 as two linears (``titan``).
  The cross-entropy backward is the exception: softmax minus one-hot, 2 ops per
  logit.
- TP with sequence parallelism: all-gather (T*h*2 bytes) before each
  column-parallel linear, reduce-scatter after each row-parallel one, mirrored
  in backward. Without sequence parallelism there is one all-reduce after each
  row-parallel linear forward and after each column-parallel dgrad. What the
  backward's collectives overlap (and the re-gather of the sequence-parallel
  input for the wgrad) is the stack's rule, ``parallelism.tp_comm_overlap``
  (``tp_comm``); the attention and dense MLP sublayers follow it, MLA and MoE
  sublayers keep their collectives blocking.
- CP (``parallelism.cp_comm_type: all_gather``, and unfused attention): K and V
  (local KV heads) are all-gathered over ``cp`` before the core and their
  gradients reduce-scattered after its backward; only the local chunk is kept, so
  the backward gathers again unless a recompute already did. With ``p2p`` and
  flash attention: Transformer Engine's ring of ``cp`` partial steps, K and V
  passed round the ring under them, outputs merged through their log-sum-exps
  (``cp_ring``).
- Under FP8 only the transformer layers' linears run in FP8; the attention core
  and the LM head stay in BF16 (Transformer Engine's default recipe), and so do
  the first and last ``training.fp8.bf16_layers`` layers (``layers``). Each FP8
  linear pays for its scaling and casts (``fp8_cast``): its BF16 input before the
  forward, its output gradient before the backward. Under current scaling
  (``training.fp8.scaling: current``) each cast is preceded by an amax pass over
  its BF16 input (one more read, one max per element); delayed scaling takes the
  scale from earlier steps and needs none. FP8 weights are cast once per step and
  cached across the microbatches (Transformer Engine), so that cast is left out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from clustersim.hardware.work import Work
from clustersim.workload.cp_ring import attention_step, ring_core
from clustersim.workload.dims import Dims
from clustersim.workload.elementwise import FUSED, Elementwise, activation_work, rope_work
from clustersim.workload.elementwise import norm_work as _norm
from clustersim.workload.elementwise import residual_work as _residual
from clustersim.workload.op_policy import op_split
from clustersim.workload.program import Phase
from clustersim.workload.recompute import DEFAULT_MODULES, recompute_templates
from clustersim.workload.templates import ACT_BYTES, Tpl
from clustersim.workload.templates import coll as _coll
from clustersim.workload.templates import compute as _compute
from clustersim.workload.tp_comm import TPComm
from clustersim.workload.unfused import unfused_core

__all__ = [
    "ACT_BYTES",
    "Block",
    "Part",
    "Tpl",
    "activation_work",
    "attention_part",
    "compose",
    "core_templates",
    "flash_core",
    "layer_block",
    "mlp_part",
    "only",
    "without",
]


@dataclass(frozen=True)
class Block:
    """Instruction templates of one part of the model.

    ``grad_ready`` maps an index into ``bwd`` to the parameter pieces (see
    ``dims.layer_pieces``) whose gradients are complete once that instruction ran.
    """

    fwd: tuple[Tpl, ...]
    bwd: tuple[Tpl, ...]
    recompute: tuple[Tpl, ...] = ()
    grad_ready: Mapping[int, tuple[str, ...]] = field(default_factory=dict)


def _operand_bytes(precision: str) -> int:
    return 1 if precision == "fp8" else ACT_BYTES


@dataclass(frozen=True)
class _Linear:
    """The forward, dgrad and wgrad ``Work`` of one linear layer (m, k, n)."""

    fwd: Work
    dgrad: Work
    wgrad: Work

    @classmethod
    def of(cls, m: int, k: int, n: int, precision: str) -> _Linear:
        op = _operand_bytes(precision)
        return cls(
            fwd=Work((m, k, n), 1, precision, hbm_bytes=op * (m * k + k * n) + ACT_BYTES * m * n),
            dgrad=Work((m, n, k), 1, precision, hbm_bytes=op * (m * n + k * n) + ACT_BYTES * m * k),
            wgrad=Work(
                (k, m, n), 1, precision, hbm_bytes=op * (m * k + m * n) + 2 * ACT_BYTES * k * n
            ),
        )


def fp8_cast(rows: int, cols: int) -> Work:
    """Scale a BF16 (rows, cols) tensor and cast it to FP8, as is and transposed.

    Transformer Engine's fused cast-transpose: read the BF16 tensor (2 B), take its
    amax and scale (2 vector ops per element), write the FP8 copy and its transpose
    (1 B each), which the dgrad and the wgrad read.
    """
    elems = rows * cols
    return Work(vector_ops=float(2 * elems), hbm_bytes=float((ACT_BYTES + 2) * elems))


def fp8_amax(rows: int, cols: int) -> Work:
    """Current scaling's amax of a BF16 (rows, cols) tensor before its cast.

    Transformer Engine's per-tensor current scaling computes the amax in a kernel of
    its own (the scale must be known before any element is cast): one read of the
    BF16 tensor (2 B) and one max per element.
    """
    elems = rows * cols
    return Work(vector_ops=float(elems), hbm_bytes=float(ACT_BYTES * elems))


def _casts(precision: str, scaling: str = "delayed") -> Callable[[str, str, int, int], list[Tpl]]:
    """The cast ops before an FP8 linear's input (none at other precisions)."""

    def cast(name: str, phase: str, rows: int, cols: int) -> list[Tpl]:
        if precision != "fp8":
            return []
        amax = [_compute(f"{name}.amax", phase, fp8_amax(rows, cols))]
        return [
            *(amax if scaling == "current" else []),
            _compute(f"{name}.cast", phase, fp8_cast(rows, cols)),
        ]

    return cast


@dataclass(frozen=True)
class Part:
    """Half a transformer layer: the attention or the feed-forward sublayer.

    ``forward(phase)`` gives its forward templates (called again for a full
    recompute); ``bwd`` its backward, with ``ready`` marking, by index into
    ``bwd``, the parameter pieces complete there; ``core(phase)`` the attention
    core, or none. ``pieces`` maps each Megatron-Core recompute module the sublayer
    has (``workload.recompute``) to the forward ops it reruns, by phase.
    """

    forward: Callable[[str], list[Tpl]]
    bwd: tuple[Tpl, ...]
    ready: Mapping[int, tuple[str, ...]]
    core: Callable[[str], list[Tpl]] | None = None
    pieces: Mapping[str, Callable[[str], list[Tpl]]] = field(default_factory=dict)


def without(forward: Callable[[str], list[Tpl]], *names: str) -> Callable[[str], list[Tpl]]:
    """``forward`` less the ops named ``names`` (what a module's checkpoint leaves out)."""
    return lambda phase: [t for t in forward(phase) if t[1] not in names]


def only(forward: Callable[[str], list[Tpl]], *names: str) -> Callable[[str], list[Tpl]]:
    """The ops of ``forward`` named ``names``, with their FP8 casts."""
    keep = tuple(f"{n}." for n in names)
    return lambda phase: [t for t in forward(phase) if t[1] in names or t[1].startswith(keep)]


def flash_core(
    dm: Dims, prec: str, qk_dim: int, v_dim: int, kv_heads: int
) -> tuple[Work, Work, Work, Work, Work, Work, Work]:
    """The flash-attention core with query/key heads of ``qk_dim`` and value heads of ``v_dim``.

    One call of the rank's query rows over the whole sequence's keys (K and V gathered
    over ``cp``), causal unless the model is an encoder (``model.causal: false``).
    Returns (qk, softmax, pv, S and dP, softmax backward, dQ, dK and dV); see the module
    doc. ``kv_heads`` are the key/value heads on this rank.
    """
    return attention_step(
        dm.micro,
        dm.heads_local,
        dm.q_rows,
        dm.seq,
        causal=dm.causal,
        prec=prec,
        qk_dim=qk_dim,
        v_dim=v_dim,
        kv_heads=kv_heads,
    ).works()


def core_templates(
    dm: Dims,
    works: tuple[Work, Work, Work, Work, Work, Work, Work],
    cp_nbytes: float,
    recompute: str,
) -> tuple[Callable[[str], list[Tpl]], list[Tpl]]:
    """The attention core's forward (by phase) and backward, with the CP collectives."""
    qk, softmax, pv, s_dp, softmax_b, dq, dkv = works
    cp_on = dm.cp > 1

    def core(phase: str) -> list[Tpl]:
        pre = [_coll("cp", "all_gather", phase, cp_nbytes)] if cp_on else []
        return [
            *pre,
            _compute("attn.core.qk", phase, qk),
            _compute("attn.core.softmax", phase, softmax),
            _compute("attn.core.pv", phase, pv),
        ]

    B = Phase.BACKWARD
    bwd: list[Tpl] = []
    if cp_on and recompute == "none":  # no recompute gathered K and V for us
        bwd.append(_coll("cp", "all_gather", B, cp_nbytes))
    bwd += [
        _compute("attn.core.bwd.qk_dp", B, s_dp),
        _compute("attn.core.bwd.softmax", B, softmax_b),
        _compute("attn.core.bwd.dq", B, dq),
        _compute("attn.core.bwd.dkv", B, dkv),
    ]
    if cp_on:
        bwd.append(_coll("cp", "reduce_scatter", B, cp_nbytes))
    return core, bwd


def attention_part(
    dm: Dims,
    precision: str,
    recompute: str,
    attention: str = "flash",
    ew: Elementwise = FUSED,
) -> Part:
    """Grouped-query attention: norm, QKV, RoPE, the core, the output projection; its
    elementwise ops as ``ew`` runs them (``workload.elementwise``)."""
    T, Ts, h, d = dm.tokens, dm.sp_tokens, dm.hidden, dm.head_dim
    a, g = dm.heads_local, dm.kv_heads_local
    core_prec = "bf16" if precision == "fp8" else precision
    tp = TPComm(dm)
    norm = _norm(dm, Ts)
    residual = _residual(Ts, h)
    qkv = _Linear.of(T, h, dm.qkv_cols, precision)
    out = _Linear.of(T, dm.attn_cols, h, precision)
    rope = rope_work(dm)
    if attention == "flash" and dm.cp > 1 and dm.cp_comm_type == "p2p":  # ``cp_ring``
        core, core_bwd = ring_core(
            dm.micro, dm.seq, dm.cp, a, prec=core_prec, qk_dim=d, v_dim=d, kv_heads=g
        )
    else:
        works = (
            unfused_core(dm, core_prec)
            if attention == "unfused"
            else flash_core(dm, core_prec, d, d, g)
        )
        cp_nbytes = dm.cp * T * 2 * g * d * ACT_BYTES  # K and V of the whole sequence
        core, core_bwd = core_templates(dm, works, cp_nbytes, recompute)

    def rope_fwd(phase: str) -> list[Tpl]:
        """RoPE on Q and K; none with learned positions (they are added at the embedding)."""
        if dm.learned_positions:
            return []
        return [*ew.forward("attn.split", phase, None), *ew.forward("attn.rope", phase, rope)]

    cast = _casts(precision, dm.fp8_scaling)

    def forward(phase: str) -> list[Tpl]:
        return [
            *ew.forward("attn.norm", phase, norm),
            *tp.column_fwd(
                phase, [*cast("attn.qkv", phase, T, h), _compute("attn.qkv", phase, qkv.fwd)]
            ),
            *rope_fwd(phase),
            *core(phase),
            *tp.row_fwd(
                phase,
                [*cast("attn.out", phase, T, dm.attn_cols), _compute("attn.out", phase, out.fwd)],
            ),
            *ew.forward("attn.residual", phase, residual),
        ]

    B = Phase.BACKWARD
    bwd: list[Tpl] = []
    ready: dict[int, tuple[str, ...]] = {}

    def mark(piece: str) -> None:
        ready[len(bwd) - 1] = (piece,)

    out_wgrad = _compute("attn.out.wgrad", B, out.wgrad)
    bwd += [*ew.backward("attn.residual", B, residual), *tp.grad_gather()]
    bwd += tp.regather_early()
    bwd += cast("attn.out.grad", B, T, h)
    bwd += [*tp.grad_ring([_compute("attn.out.dgrad", B, out.dgrad)]), *tp.grad_gathered()]
    if not tp.defers_wgrad:
        bwd += [out_wgrad]
        mark("attn.out")
    bwd += core_bwd
    if not dm.learned_positions:
        bwd += [*ew.backward("attn.rope", B, rope), *ew.backward("attn.split", B, None)]
    bwd += cast("attn.qkv.grad", B, T, dm.qkv_cols)
    bwd += [*tp.regather_late(), _compute("attn.qkv.dgrad", B, qkv.dgrad), *tp.start_reduce()]
    if tp.defers_wgrad:
        bwd += [out_wgrad]
        mark("attn.out")
    bwd += [_compute("attn.qkv.wgrad", B, qkv.wgrad)]
    mark("attn.qkv")
    bwd += [*tp.finish_reduce(), *ew.backward("attn.norm", B, norm)]
    mark("attn.norm")

    def op_rerun(phase: str) -> list[Tpl]:
        """What torchtitan's op policy reruns (``workload.op_policy``): every op but the
        saved GEMMs, the attention kernel and the reduce-scatter."""
        gemms, row = _op_gemms(dm, precision, "attn.", phase)
        return [
            *ew.forward("attn.norm", phase, norm),
            *tp.column_fwd(phase, gemms),
            *rope_fwd(phase),
            *row,
            *ew.forward("attn.residual", phase, residual),
        ]

    return Part(forward, tuple(bwd), ready, core, {"core_attn": core, "op": op_rerun})


def mlp_part(dm: Dims, precision: str, ew: Elementwise = FUSED) -> Part:
    """The dense MLP: norm, up (gate and up under SwiGLU, one linear unless ``ew`` splits
    them), activation, down; its elementwise ops as ``ew`` runs them."""
    T, Ts, h = dm.tokens, dm.sp_tokens, dm.hidden
    tp = TPComm(dm)
    norm = _norm(dm, Ts)
    residual = _residual(Ts, h)
    if ew.split_up and dm.swiglu:  # w1 (gate) and w3 (up), each f wide
        w = _Linear.of(T, h, dm.ffn_local, precision)
        ups = [("mlp.up.w1", w), ("mlp.up.w3", w)]
    else:
        ups = [("mlp.up", _Linear.of(T, h, dm.up_cols, precision))]
    down = _Linear.of(T, dm.ffn_local, h, precision)
    act = activation_work(T * dm.ffn_local, dm.swiglu)

    cast = _casts(precision, dm.fp8_scaling)

    def forward(phase: str) -> list[Tpl]:
        return [
            *ew.forward("mlp.norm", phase, norm),
            *tp.column_fwd(
                phase, [*cast("mlp.up", phase, T, h), *(_compute(n, phase, u.fwd) for n, u in ups)]
            ),
            *ew.forward("mlp.act", phase, act),
            *tp.row_fwd(
                phase,
                [*cast("mlp.down", phase, T, dm.ffn_local), _compute("mlp.down", phase, down.fwd)],
            ),
            *ew.forward("mlp.residual", phase, residual),
        ]

    B = Phase.BACKWARD
    bwd: list[Tpl] = []
    ready: dict[int, tuple[str, ...]] = {}

    def mark(piece: str) -> None:
        ready[len(bwd) - 1] = (piece,)

    down_wgrad = _compute("mlp.down.wgrad", B, down.wgrad)
    bwd += [*ew.backward("mlp.residual", B, residual), *tp.grad_gather()]
    bwd += tp.regather_early()
    bwd += cast("mlp.down.grad", B, T, h)
    bwd += [*tp.grad_ring([_compute("mlp.down.dgrad", B, down.dgrad)]), *tp.grad_gathered()]
    if not tp.defers_wgrad:
        bwd += [down_wgrad]
        mark("mlp.down")
    bwd += ew.backward("mlp.act", B, act)
    bwd += cast("mlp.up.grad", B, T, dm.up_cols)
    bwd += [*tp.regather_late(), *(_compute(f"{n}.dgrad", B, u.dgrad) for n, u in ups)]
    bwd += [*ew.backward("mlp.up.sum", B, None), *tp.start_reduce()]
    if tp.defers_wgrad:
        bwd += [down_wgrad]
        mark("mlp.down")
    bwd += [_compute(f"{n}.wgrad", B, u.wgrad) for n, u in ups]
    mark("mlp.up")
    bwd += [*tp.finish_reduce(), *ew.backward("mlp.norm", B, norm)]
    mark("mlp.norm")

    def op_rerun(phase: str) -> list[Tpl]:
        """What torchtitan's op policy reruns, up to the down projection's input (the last
        tensor the backward needs): the norm, the all-gather, the GEMMs of even count
        (``workload.op_policy``) and the activation."""
        gemms, row = _op_gemms(dm, precision, "mlp.", phase)
        norm_op, act_op = ew.forward("mlp.norm", phase, norm), ew.forward("mlp.act", phase, act)
        return [*norm_op, *tp.column_fwd(phase, gemms), *act_op, *row]

    # Megatron's ``mlp`` recompute reruns the MLP module: its fused norm, TP collectives
    # and linears, not the residual add after it.
    pieces = {"mlp": without(forward, "mlp.residual"), "op": op_rerun}
    return Part(forward, tuple(bwd), ready, pieces=pieces)


def _op_gemms(dm: Dims, precision: str, prefix: str, phase: str) -> tuple[list[Tpl], list[Tpl]]:
    """The forward GEMMs of one sublayer (``prefix``) that torchtitan's op policy reruns:
    the column-parallel ones, and the row-parallel one (its reduce-scatter's output kept)."""
    col: list[Tpl] = []
    row: list[Tpl] = []
    for m in op_split(dm)[1]:
        if m.name.startswith(prefix):
            op = _compute(m.name, phase, _Linear.of(m.rows, m.k, m.n, precision).fwd)
            (row if m.row_parallel else col).append(op)
    return col, row


def compose(
    attn: Part, ffn: Part, recompute: str, modules: frozenset[str] = DEFAULT_MODULES
) -> Block:
    """One layer from its two sublayers: attention then feed-forward, backward in reverse.

    ``selective`` reruns the ``modules`` of ``workload.recompute`` the sublayers have.
    """
    F = Phase.FORWARD
    fwd = (*attn.forward(F), *ffn.forward(F))
    bwd = (*ffn.bwd, *attn.bwd)
    ready = dict(ffn.ready)
    ready.update({i + len(ffn.bwd): pieces for i, pieces in attn.ready.items()})
    if recompute == "none":
        rec: tuple[Tpl, ...] = ()
    elif recompute == "selective":
        rec = recompute_templates(attn.pieces, ffn.pieces, modules)
    elif recompute == "full":
        rec = (*attn.forward(Phase.RECOMPUTE), *ffn.forward(Phase.RECOMPUTE))
    else:
        raise ValueError(f"unknown recompute {recompute!r}")
    return Block(fwd, bwd, rec, ready)


def layer_block(dm: Dims, precision: str, recompute: str, attention: str = "flash") -> Block:
    """Templates of one dense transformer layer (identical for every layer)."""
    return compose(
        attention_part(dm, precision, recompute, attention), mlp_part(dm, precision), recompute
    )
