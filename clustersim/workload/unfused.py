"""The attention core without flash attention (``parallelism.attention: unfused``):
scores and probabilities go through HBM and the causal square is computed whole, as
Megatron-LM ran it before flash attention (``workload.ops`` lowers it)."""

from __future__ import annotations

from clustersim.hardware.work import Work
from clustersim.workload.dims import Dims
from clustersim.workload.templates import ACT_BYTES

__all__ = ["unfused_core"]


def unfused_core(dm: Dims, prec: str) -> tuple[Work, Work, Work, Work, Work, Work, Work]:
    """The attention core without flash attention: scores and probabilities in HBM.

    Returns (qk, softmax, pv, dP, softmax backward, dQ, dK and dV); see the module doc.
    """
    s, q, d, b = dm.seq, dm.q_rows, dm.head_dim, dm.micro
    a, g = dm.heads_local, dm.kv_heads_local
    heads = b * a
    q_bytes = ACT_BYTES * dm.tokens * a * d  # Q, O, dO or dQ on this rank
    kv_bytes = ACT_BYTES * b * s * g * d  # K or V of the whole sequence
    scores = heads * q * s
    sb = ACT_BYTES * scores  # one bf16 pass over the scores
    qk = Work((q, d, s), heads, prec, hbm_bytes=float(q_bytes + kv_bytes + sb))
    # scale-mask-softmax reads the scores and writes the probabilities; with attention
    # dropout a kernel reads those and writes them dropped, with a one-byte mask
    drop = dm.attention_dropout > 0
    softmax = Work(
        scalar_ops=float(scores),
        vector_ops=float((4 if drop else 3) * scores),
        hbm_bytes=float(4 * sb + scores if drop else 2 * sb),
    )
    pv = Work((q, s, d), heads, prec, hbm_bytes=float(sb + kv_bytes + q_bytes))
    dp = Work((q, d, s), heads, prec, hbm_bytes=float(q_bytes + kv_bytes + sb))
    # reads dP (and the dropout mask) and the probabilities, writes dS
    softmax_b = Work(
        vector_ops=float((5 if drop else 4) * scores),
        hbm_bytes=float(3 * sb + (scores if drop else 0)),
    )
    dq = Work((q, s, d), heads, prec, hbm_bytes=float(sb + kv_bytes + q_bytes))
    # dK = dS^T Q and dV = P^T dO: each reads a pass of scores and writes K or V
    dkv = Work((s, q, d), 2 * heads, prec, hbm_bytes=float(2 * (sb + q_bytes + kv_bytes)))
    return qk, softmax, pv, dp, softmax_b, dq, dkv
