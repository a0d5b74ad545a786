"""Multi-head latent attention (DeepSeek-V2/V3): parameters, op templates, activations.

MLA (arXiv 2412.19437 section 2.1.1) replaces the QKV projection by low-rank
projections. Per token, with h hidden, r_q and r_kv the query and KV latent
ranks, d_n and d_r the non-RoPE and RoPE parts of a query/key head, d_v a value
head and H heads (a = H / tp on one rank):

- down-projections ``attn.down``: h -> r_q (queries) and h -> r_kv + d_r (the
  KV latent and the one RoPE key head all heads share), as one matmul. Their
  weights are replicated on every TP rank; under sequence parallelism they run
  on the rank's sequence shard and the *latents* are all-gathered over TP
  (Megatron-Core's MLA), T*(r_q + r_kv + d_r) elements instead of T*h;
- RMSNorms on both latents (``attn.latent_norm``);
- up-projections ``attn.up``: r_q -> a*(d_n + d_r) (queries) and
  r_kv -> a*(d_n + d_v) (keys without RoPE, and values), column-parallel;
- RoPE on the a query heads' d_r part and on the shared key head;
- the attention core with query/key heads of d_n + d_r and value heads of d_v
  (the core itself is built by ``ops``);
- ``attn.out``: a*d_v -> h, row-parallel.

Left out: the TP all-reduce of the replicated down-projections' weight
gradients (once per step, like the norm weights') and the inference-time
absorption of the up-projections into the core.
"""

from __future__ import annotations

from clustersim.catalog.schema import MLASpec, ModelSpec
from clustersim.hardware.work import Work
from clustersim.workload.cp_ring import ring_core
from clustersim.workload.dims import Dims
from clustersim.workload.elementwise import norm_work as _norm
from clustersim.workload.elementwise import residual_work as _residual
from clustersim.workload.ops import (
    ACT_BYTES,
    Part,
    Tpl,
    _Linear,
    core_templates,
    flash_core,
    only,
)
from clustersim.workload.program import Phase
from clustersim.workload.templates import coll as _coll
from clustersim.workload.templates import compute as _compute
from clustersim.workload.templates import twice as _twice
from clustersim.workload.tp_comm import TPComm

__all__ = ["mla_activation_bytes", "mla_attention_part", "mla_layer_params"]


def mla_layer_params(model: ModelSpec, mla: MLASpec) -> int:
    """Attention parameters of one MLA layer (no sharding): projections and latent norms."""
    h, heads = model.hidden, model.heads
    down = h * (mla.q_lora_rank + mla.kv_lora_rank + mla.qk_rope_head_dim)
    q_in = mla.q_lora_rank or h  # without query compression, queries come from h
    q_up = q_in * heads * mla.qk_head_dim
    kv_up = mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    out = heads * mla.v_head_dim * h
    norms = mla.q_lora_rank + mla.kv_lora_rank
    return down + q_up + kv_up + out + norms


def _latent_width(mla: MLASpec) -> int:
    """What the down-projections write per token: both latents and the shared RoPE key."""
    return mla.q_lora_rank + mla.kv_lora_rank + mla.qk_rope_head_dim


def mla_activation_bytes(
    dm: Dims, mla: MLASpec, recompute: str, modules: frozenset[str] = frozenset({"core_attn"})
) -> int:
    """Bytes an MLA sublayer keeps for its backward, per microbatch, on one rank.

    As Megatron-Core 0.14 builds MLA with Transformer Engine (a norm module of its
    own, two down-projections, the latent norms fused into the up-projections), with
    l B per element of a linear's saved input (``Dims.saved_input_bytes``):

    - the norm's input (2*T_sp*h) and the two down-projections' inputs (the normed
      sequence shard: 2*T_sp*h in BF16, where they share it, and one FP8 copy each
      under FP8), unless ``layernorm`` recompute reruns the norm;
    - the latents (2*T*(r_q + r_kv + d_r), the up-projections' inputs) and their
      normed copies the fused up-projections keep (l*T*(r_q + r_kv)), the latter not
      under ``mla_up_proj`` recompute, which keeps only its checkpoint's inputs;
    - Q and K of d_n + d_r and V of d_v per local head (the core's inputs), freed
      under ``mla_up_proj`` once the core has run;
    - O (2*T*a*d_v) and the FP32 log-sum-exp, unless ``core_attn`` reruns the core,
      and under FP8 the output projection's copy of O (l*T*a*d_v).
    """
    T, Ts, a = dm.tokens, dm.sp_tokens, dm.heads_local
    if recompute == "full":
        return 0  # the layer's input is counted once by the caller
    mods = modules if recompute == "selective" else frozenset()
    lin = dm.saved_input_bytes
    total = 2 * Ts * dm.hidden + 2 * T * _latent_width(mla)
    if "layernorm" not in mods:
        total += 2 * Ts * dm.hidden
    if "mla_up_proj" not in mods:
        total += lin * T * (mla.q_lora_rank + mla.kv_lora_rank)
        total += 2 * T * a * (2 * mla.qk_head_dim + mla.v_head_dim)
    if lin < 2:
        total += lin * T * a * mla.v_head_dim
    if "core_attn" not in mods:
        total += 2 * T * a * mla.v_head_dim + 4 * T * a
    return total


def mla_attention_part(dm: Dims, mla: MLASpec, precision: str, recompute: str) -> Part:
    """MLA's templates (see the module doc); the core is ``ops.flash_core`` with MLA widths."""
    T, Ts, h, a = dm.tokens, dm.sp_tokens, dm.hidden, dm.heads_local
    dn, dr, dv = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
    core_prec = "bf16" if precision == "fp8" else precision
    tp = TPComm(dm)
    gather = tp.on and tp.sp
    width = _latent_width(mla)
    latent_bytes = float(T * width * ACT_BYTES)
    norm = _norm(dm, Ts)
    residual = _residual(Ts, h)
    # Down-projections on the rank's tokens (its sequence shard under SP).
    # (Without query compression, r_q = 0 and the queries come from h in ``q_up``.)
    down = _Linear.of(Ts, h, width, precision)
    latent_elems = Ts * (mla.q_lora_rank + mla.kv_lora_rank)
    latent_norm = Work(
        vector_ops=float(3 * latent_elems),
        scalar_ops=float(2 * Ts),
        hbm_bytes=float(ACT_BYTES * 2 * latent_elems),
    )
    q_in = mla.q_lora_rank or h
    q_up = _Linear.of(T, q_in, a * (dn + dr), precision)
    kv_up = _Linear.of(T, mla.kv_lora_rank, a * (dn + dv), precision)
    out = _Linear.of(T, a * dv, h, precision)
    rope_elems = T * (a + 1) * dr  # the query heads' RoPE parts and the shared key head
    rope = Work(
        vector_ops=float(3 * rope_elems),
        hbm_bytes=float(ACT_BYTES * (2 * rope_elems + 2 * T * dr)),
    )
    if dm.cp > 1 and dm.cp_comm_type == "p2p":  # ``cp_ring``; K and V per query head
        core, core_bwd = ring_core(
            dm.micro, dm.seq, dm.cp, a, prec=core_prec, qk_dim=dn + dr, v_dim=dv, kv_heads=a
        )
    else:
        works = flash_core(dm, core_prec, dn + dr, dv, a)
        cp_nbytes = dm.cp * T * a * (dn + dr + dv) * ACT_BYTES  # K and V of the whole sequence
        core, core_bwd = core_templates(dm, works, cp_nbytes, recompute)

    def forward(phase: str) -> list[Tpl]:
        pre = [_coll("tp", "all_gather", phase, latent_bytes, ".latent")] if gather else []
        return [
            _compute("attn.norm", phase, norm),
            _compute("attn.down", phase, down.fwd),
            _compute("attn.latent_norm", phase, latent_norm),
            *pre,
            _compute("attn.q_up", phase, q_up.fwd),
            _compute("attn.kv_up", phase, kv_up.fwd),
            _compute("attn.rope", phase, rope),
            *core(phase),
            _compute("attn.out", phase, out.fwd),
            *tp.exit_fwd(phase),
            _compute("attn.residual", phase, residual),
        ]

    B = Phase.BACKWARD
    bwd: list[Tpl] = []
    ready: dict[int, tuple[str, ...]] = {}

    def mark(piece: str) -> None:
        ready[len(bwd) - 1] = (piece,)

    bwd += [_compute("attn.residual", B, _twice(residual)), *tp.exit_bwd()]
    bwd += [_compute("attn.out.dgrad", B, out.dgrad), _compute("attn.out.wgrad", B, out.wgrad)]
    mark("attn.out")
    bwd += core_bwd
    bwd += [_compute("attn.rope", B, _twice(rope))]
    bwd += [
        _compute("attn.kv_up.dgrad", B, kv_up.dgrad),
        _compute("attn.kv_up.wgrad", B, kv_up.wgrad),
        _compute("attn.q_up.dgrad", B, q_up.dgrad),
        _compute("attn.q_up.wgrad", B, q_up.wgrad),
    ]
    mark("attn.up")
    if tp.on:  # the column-parallel up-projections leave partial sums of the latents' gradients
        kind = "reduce_scatter" if tp.sp else "all_reduce"
        bwd.append(_coll("tp", kind, B, latent_bytes, ".latent"))
    bwd += [_compute("attn.latent_norm", B, _twice(latent_norm))]
    mark("attn.latent_norm")
    bwd += [_compute("attn.down.dgrad", B, down.dgrad), _compute("attn.down.wgrad", B, down.wgrad)]
    mark("attn.down")
    bwd += [_compute("attn.norm", B, _twice(norm))]
    mark("attn.norm")
    pieces = {
        "layernorm": only(forward, "attn.norm"),
        # qkv_up_proj_and_rope_apply: the latent norms fused into the up-projections
        "mla_up_proj": only(forward, "attn.latent_norm", "attn.q_up", "attn.kv_up", "attn.rope"),
        "core_attn": core,
    }
    return Part(forward, tuple(bwd), ready, core, pieces)
