"""torchtitan's elementwise kernels of a dense Llama block: eager or compiled (software.compile).

torchtitan runs its model eagerly unless ``compile.enable`` is set
(pytorch/torchtitan@v0.3.0:torchtitan/config/configs.py ``CompileConfig.enable = False``;
its Llama 3 8B config, models/llama3/config_registry.py ``llama3_8b``, leaves it off);
with it, each transformer block is compiled on its own (torchtitan/distributed/compile.py
``apply_compile``: ``transformer_block.compile(fullgraph=True)`` per block), and
Inductor fuses the elementwise chains. The block (models/llama3/model.py
``Llama3TransformerBlock.forward``) is ``h = x + attention(attention_norm(x))``,
``out = h + feed_forward(ffn_norm(h))``, with ``nn.RMSNorm`` norms
(models/common/nn_modules.py ``RMSNorm``), one fused QKV linear split by
``.contiguous()`` copies (models/common/attention.py ``FusedQKVLinear``; ``fuse_qkv=True``
in models/llama3/__init__.py), complex RoPE (models/common/rope.py
``ComplexRoPE.apply_rotary_emb``) and ``w2(F.silu(w1(x)) * w3(x))`` with separate w1 and
w3 linears (models/common/feed_forward.py ``FeedForward``).

Bytes per element below are of the op's tensor: R = T_sp*h (the residual stream),
E = T*a*d and T*g*d (q and k), V = T*g*d (v), F = T*f (the MLP's width), bf16 2 B,
FP32 4 B. Per-row reads and writes (the norm's FP32 rstd), the weights' reads and the
RoPE table's (complex64, s*d/2 per kernel, shared by the batch and the heads) are left out
where noted. Every kernel pays the chip's per-op overhead (``calibration.op_overhead_s``).

Eager, on PyTorch 2.9 (torchtitan 0.3.0's wheel pins no PyTorch; a release of 2.9 or
later is assumed, unconfirmed), whose ``rms_norm`` has a CUDA kernel of its own
(torch 2.9.0's torchgen/packaged/ATen/native/native_functions.yaml: ``_fused_rms_norm``
dispatches CUDA to ``_fused_rms_norm_cuda``; derivatives.yaml: its backward is
``_fused_rms_norm_backward``). PyTorch 2.8 and earlier ran ``rms_norm`` as a composite
of about eight kernels (upcast to FP32, square, mean, add eps, rsqrt, multiply, cast
back, multiply by the weight: about 36 B an element; recalled, not read here), which
this module does not model:

- RMSNorm forward: one kernel, reads x, writes y (4 B; the fused lowering's).
  Backward: the layer-norm family's two kernels: dx (reads dy and x, writes dx: 6 B) and
  dweight (reads dy and x: 4 B).
- QKV split: three ``.contiguous()`` copies, q, k and v (4 B each); backward: one cat of
  dq, dk and dv into the fused gradient (4 B of the QKV width).
- RoPE, for q and for k: ``.float()`` (reads 2, writes 4: 6 B), the complex multiply
  (reads 4, writes 4: 8 B; 3 ops an element), ``view_as_real(...).type_as`` (6 B): three
  kernels and 20 B each; backward the same three in reverse (the multiply by the
  table's conjugate, the casts back): 20 B.
- Residual add: one kernel (6 B); backward: the add passes the gradient on, and autograd
  sums the residual stream's two gradients (its norm's and the skip's): one add, 6 B.
- SwiGLU: ``silu(w1 x)`` (reads 2, writes 2: 4 B) and ``* w3 x`` (6 B): two kernels,
  10 B of F. Backward: the multiply's two gradients (6 B each) and ``silu_backward``
  (reads the gradient and w1's output, writes: 6 B): three kernels, 18 B; w1's and w3's
  input gradients summed by one more add (6 B of T*h).

Compiled (Inductor; the fusion boundaries are assumed, unconfirmed, from its usual
rules: pointwise ops and reductions over the same rows fuse, a GEMM (cuBLAS) ends a
chain, the graph ends at the block):

- the first norm: one kernel as eager's; its backward one kernel (twice the forward),
  reading the block output's gradient too (the residual sum fused in: +2 B);
- the QKV split and RoPE of q and k: one kernel reading q, k, v and writing them
  (the fused lowering's RoPE plus v's copy, 4 B of V); backward twice that;
- the attention's residual add and ``ffn_norm``: one kernel, reads x and the attention
  output, writes h and the normed h (8 B: one read of h fewer than the add and the norm
  apart); its backward one kernel in ``mlp.norm``'s place, twice the norm's, reading
  the skip's gradient and (without TP) w3's input gradient as well (+4 B); the adds'
  own backward kernels vanish;
- silu*mul: one kernel (the fused lowering's, 6 B of F), backward twice;
- the block's last residual add: one kernel (6 B), the graph's output.

The w1/w3 split holds eager and compiled (torchtitan's module structure); under TP the
sum of their input gradients precedes the collective and stays a kernel of its own.
Only dense Llama-style blocks (RMSNorm, RoPE, SwiGLU, flash attention, grouped-query
attention, BF16) take these kernels; other layer kinds keep the fused lowering
(``elementwise_for``).
"""

from __future__ import annotations

from dataclasses import replace

from clustersim.catalog.schema import ModelSpec
from clustersim.hardware.work import Work
from clustersim.workload.dims import Dims
from clustersim.workload.elementwise import (
    FUSED,
    Elementwise,
    Kernels,
    norm_work,
    residual_work,
    rope_work,
)
from clustersim.workload.templates import ACT_BYTES, twice

__all__ = ["LOWERINGS", "elementwise_for", "lowering_of", "titan_block", "titan_elementwise"]

LOWERINGS = ("fused", "eager", "compiled")

_F32 = 4
"""Bytes of an FP32 element (the RoPE's upcast)."""


def _copy(elems: int) -> Work:
    """A bf16 copy: reads and writes every element, no arithmetic."""
    return Work(hbm_bytes=float(2 * ACT_BYTES * elems))


def _binary(elems: int) -> Work:
    """A bf16 add or multiply of two tensors (one op an element; reads two, writes one)."""
    return Work(vector_ops=float(elems), hbm_bytes=float(3 * ACT_BYTES * elems))


def _rope_eager(prefix: str, which: str, elems: int) -> Kernels:
    """RoPE of q or k as ``ComplexRoPE.apply_rotary_emb`` runs it eagerly: upcast, complex
    multiply, cast back (module doc); the backward's kernels are the same three."""
    cast = Work(vector_ops=float(elems), hbm_bytes=float((ACT_BYTES + _F32) * elems))
    mul = Work(vector_ops=float(3 * elems), hbm_bytes=float(2 * _F32 * elems))
    return (
        (f"{prefix}.{which}.float", cast),
        (f"{prefix}.{which}.mul", mul),
        (f"{prefix}.{which}.type_as", cast),
    )


def _norm_bwd_eager(name: str, dm: Dims, rows: int) -> Kernels:
    """``_fused_rms_norm_backward``: dx (reads dy, x; writes dx) and dweight (reads dy, x)."""
    elems = rows * dm.hidden
    dx = Work(vector_ops=float(4 * elems), scalar_ops=float(rows), hbm_bytes=6.0 * elems)
    dw = Work(vector_ops=float(2 * elems), hbm_bytes=4.0 * elems)
    return ((f"{name}.dx", dx), (f"{name}.dweight", dw))


def _eager(dm: Dims) -> Elementwise:
    T, Ts, h, d = dm.tokens, dm.sp_tokens, dm.hidden, dm.head_dim
    q, kv = T * dm.heads_local * d, T * dm.kv_heads_local * d
    f = T * dm.ffn_local
    split = (("attn.split.q", _copy(q)), ("attn.split.k", _copy(kv)), ("attn.split.v", _copy(kv)))
    rope_q, rope_k = _rope_eager("attn.rope", "q", q), _rope_eager("attn.rope", "k", kv)
    silu = Work(scalar_ops=float(f), vector_ops=float(f), hbm_bytes=float(2 * ACT_BYTES * f))
    silu_bwd = Work(
        scalar_ops=float(f), vector_ops=float(3 * f), hbm_bytes=float(3 * ACT_BYTES * f)
    )
    mul_bwd = Work(vector_ops=float(f), hbm_bytes=float(3 * ACT_BYTES * f))
    fwd: dict[str, Kernels] = {
        "attn.split": split,
        "attn.rope": (*rope_q, *rope_k),
        "mlp.act": (("mlp.act.silu", silu), ("mlp.act.mul", _binary(f))),
    }
    bwd: dict[str, Kernels] = {
        "attn.norm": _norm_bwd_eager("attn.norm", dm, Ts),
        "attn.split": (("attn.split.cat", _copy(q + 2 * kv)),),
        "attn.rope": (*reversed(rope_k), *reversed(rope_q)),
        "attn.residual": (("attn.residual.sum", _binary(Ts * h)),),
        "mlp.norm": _norm_bwd_eager("mlp.norm", dm, Ts),
        "mlp.act": (
            ("mlp.act.mul.dgate", mul_bwd),
            ("mlp.act.mul.dup", mul_bwd),
            ("mlp.act.silu", silu_bwd),
        ),
        "mlp.up.sum": (("mlp.up.sum", _binary(T * h)),),
        "mlp.residual": (("mlp.residual.sum", _binary(Ts * h)),),
    }
    return Elementwise(fwd, bwd, split_up=True, name="eager")


def _plus(work: Work, vector_ops: float, hbm_bytes: float) -> Work:
    return replace(
        work, vector_ops=work.vector_ops + vector_ops, hbm_bytes=work.hbm_bytes + hbm_bytes
    )


def _compiled(dm: Dims) -> Elementwise:
    T, Ts, h = dm.tokens, dm.sp_tokens, dm.hidden
    R = Ts * h
    v = T * dm.kv_heads_local * dm.head_dim
    norm, residual = norm_work(dm, Ts), residual_work(Ts, h)
    rope = _plus(rope_work(dm), 0.0, float(2 * ACT_BYTES * v))  # v's copy fused in
    add_norm = Work(
        vector_ops=residual.vector_ops + norm.vector_ops,
        scalar_ops=norm.scalar_ops,
        hbm_bytes=residual.hbm_bytes + norm.hbm_bytes - ACT_BYTES * R,  # h not read back
    )
    tp_sum = dm.tp > 1  # w1's and w3's input gradients meet before the TP collective
    extra = 1 if tp_sum else 2  # gradients the ffn_norm backward reads besides its own
    fwd: dict[str, Kernels] = {
        "attn.rope": (("attn.rope", rope),),
        "attn.residual": (("attn.residual.ffn_norm", add_norm),),
        "mlp.norm": (),
    }
    bwd: dict[str, Kernels] = {
        "attn.norm": (("attn.norm", _plus(twice(norm), R, ACT_BYTES * R)),),
        "attn.rope": (("attn.rope", twice(rope)),),
        "attn.residual": (),
        "mlp.norm": (("mlp.norm", _plus(twice(norm), extra * R, extra * ACT_BYTES * R)),),
        "mlp.up.sum": (("mlp.up.sum", _binary(T * h)),) if tp_sum else (),
        "mlp.residual": (),
    }
    return Elementwise(fwd, bwd, split_up=True, name="compiled")


def titan_elementwise(dm: Dims, compiled: bool) -> Elementwise:
    """torchtitan's kernels for a dense Llama block on ``dm``'s shapes (module doc)."""
    return _compiled(dm) if compiled else _eager(dm)


def lowering_of(compile: bool | None, stack_rule: bool | None) -> str:
    """The lowering a scenario's resolved ``software.compile`` asks for under a stack whose
    rule is ``stack_rule`` (``StackFit.compile``): a stack with no torch.compile switch
    (None) runs its fused kernels whatever the scenario says."""
    if stack_rule is None or compile is None:
        return "fused"
    return "compiled" if compile else "eager"


def titan_block(model: ModelSpec, precision: str, attention: str) -> bool:
    """Whether ``model``'s layers are the dense Llama-style blocks these kernels model."""
    return (
        model.moe is None
        and model.mla is None
        and model.activation == "swiglu"
        and model.norm == "rmsnorm"
        and model.position == "rope"
        and precision != "fp8"
        and attention == "flash"
    )


def elementwise_for(
    lowering: str, model: ModelSpec, dm: Dims, precision: str, attention: str
) -> Elementwise:
    """The elementwise kernels of ``model``'s dense layers under ``lowering``: torchtitan's
    eager or compiled ones for a dense Llama-style block, else the fused lowering."""
    if lowering == "fused" or not titan_block(model, precision, attention):
        return FUSED
    if lowering not in LOWERINGS:
        raise ValueError(f"unknown lowering {lowering!r}")
    return titan_elementwise(dm, lowering == "compiled")
