"""Context-parallel attention as Transformer Engine runs it: a ring of partial steps.

With ``cp > 1`` each rank holds ``s / cp`` rows of every sequence, cut for the
causal mask's load balance into two chunks of ``c = s / (2 cp)`` rows: rank ``r``
holds chunks ``r`` and ``2 cp - 1 - r``, so every rank has as many rows near the
start of the sequence (few keys) as near its end (many). Transformer Engine's
``cp_comm_type: p2p`` (``AttnFuncWithCPAndKVP2P``, as NeMo 24.07 runs it) computes
the attention in ``cp`` steps while the ranks pass their K and V round the ring:

- **Forward.** Step 0 is the diagonal: the local queries over the local K and V,
  causal (``2c`` rows over ``2c`` keys, the causal mask halving the useful keys).
  Step ``i > 0`` uses the K and V of the rank ``i`` places back in the ring and is
  not masked: a rank that has the chunks of an earlier rank runs all its queries
  over the first half of those keys (``2c`` rows over ``c`` keys); of a later
  rank, the second half of its queries over all of them (``c`` over ``2c``). Both
  are ``2 c^2`` scores, as is the diagonal, so the steps add up to the FLOPs of the
  unsplit causal attention exactly (``cp · 2c^2 = (s/cp) · s/2``). Every rank runs
  the same program, so the off-diagonal steps alternate the two shapes (the ranks
  of a ring run as many of each, on average). Each step writes its partial output
  and log-sum-exp; from the second step on, the running log-sum-exp is corrected
  (``flash_attn_fwd_softmax_lse_correction``, FP64) and, after the last step, each
  step's output is rescaled by ``exp(lse_i - lse)`` and added into the output
  (``flash_attn_fwd_out_correction``, into an output zeroed first): memory-bound
  elementwise kernels.
- **Ring transfers.** Before step ``i`` computes, it starts sending the K and V it
  holds to the next rank and receiving the next step's from the previous one, and
  waits for them only before step ``i + 1``: the transfer overlaps the step. A
  ring shift moves one message per rank to its neighbour; it runs as the
  all-gather over ``cp`` that moves the same bytes per rank (``cp / (cp - 1)``
  times the message: with ``cp = 2``, the pairwise exchange itself).
- **Backward.** The same ``cp`` steps again, each a flash-attention backward of
  its step's shape with the final output and log-sum-exp, while K and V go round
  the ring once more and their gradients with them: step 0 sends K and V, the
  middle steps K, V, dK and dV in one message, the last step dK and dV (each
  waited for after its step's kernels). The off-diagonal steps' dQ and dK/dV add
  into the running gradients (elementwise, BF16).

Not modelled: the copies Transformer Engine makes of half-chunk views
(``.contiguous()``, a few MB per step), and the second stream it runs the
corrections on (they are in line here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from clustersim.hardware.work import Work
from clustersim.workload.program import Phase
from clustersim.workload.templates import ACT_BYTES, Tpl, async_coll, compute, twice, wait

__all__ = ["AttnStep", "attention_step", "ring_core", "ring_steps", "shift_bytes"]

LSE_BYTES = 4
"""FP32 log-sum-exp per query row and head, as flash attention writes it."""
LSE_RUNNING_BYTES = 8
"""The running log-sum-exp Transformer Engine corrects in FP64 (``torch.double``)."""


@dataclass(frozen=True)
class AttnStep:
    """The ``Work`` of one flash-attention call: forward (qk, softmax, pv) and backward
    (S and dP, softmax backward, dQ, dK and dV)."""

    qk: Work
    softmax: Work
    pv: Work
    s_dp: Work
    softmax_b: Work
    dq: Work
    dkv: Work

    def works(self) -> tuple[Work, Work, Work, Work, Work, Work, Work]:
        return (self.qk, self.softmax, self.pv, self.s_dp, self.softmax_b, self.dq, self.dkv)


def attention_step(
    micro: int,
    heads: int,
    rows: int,
    keys: int,
    *,
    causal: bool,
    prec: str,
    qk_dim: int,
    v_dim: int,
    kv_heads: int,
) -> AttnStep:
    """One flash-attention call of ``rows`` queries over ``keys`` keys per sequence.

    ``heads`` query heads and ``kv_heads`` key/value heads on the rank, ``micro``
    sequences. A causal call (``rows == keys``, or the rows the last of the keys)
    does half the scores. Scores never reach HBM: the call reads Q, K, V, writes O
    and the FP32 log-sum-exp; its backward recomputes the scores (five matmuls of
    the forward's size: S = QK^T and dP = dO V^T, then dQ, then dK and dV).
    """
    b, a = micro, heads
    q_bytes = ACT_BYTES * b * rows * a * qk_dim  # Q (or dQ)
    o_bytes = ACT_BYTES * b * rows * a * v_dim  # O (or dO)
    k_bytes = ACT_BYTES * b * keys * kv_heads * qk_dim
    v_bytes = ACT_BYTES * b * keys * kv_heads * v_dim
    lse_bytes = LSE_BYTES * b * rows * a
    useful_keys = max(keys // 2, 1) if causal else keys  # per query row, on average
    useful_rows = max(rows // 2, 1) if causal else rows  # per key, on average
    n_heads = b * a  # independent attention problems: sequences x local heads
    # The fused kernel's efficiency (Calibration.attention_efficiency), or its measured
    # time for this shape (Calibration.attention_times), forward and backward apart.
    fa, fb = "attention", "attention_bwd"
    shape = (keys, n_heads, qk_dim, v_dim, max(a // max(kv_heads, 1), 1))
    qk = Work(
        (rows, qk_dim, useful_keys),
        n_heads,
        prec,
        hbm_bytes=float(q_bytes + k_bytes),
        kernel=fa,
        attention=shape,
    )
    scores = b * rows * useful_keys * a
    softmax = Work(
        scalar_ops=float(scores),
        vector_ops=float(2 * scores),
        precision=prec,
        kernel=fa,
        attention=shape,
    )
    pv_bytes = float(v_bytes + o_bytes + lse_bytes)
    pv = Work(
        (rows, useful_keys, v_dim), n_heads, prec, hbm_bytes=pv_bytes, kernel=fa, attention=shape
    )
    # Equal widths: two matmuls of one shape (as dense models have always been lowered).
    if qk_dim == v_dim:
        sdp_shape, n = (rows, qk_dim, useful_keys), 2
        dkv_shape = (keys, useful_rows, qk_dim)
    else:
        sdp_shape, n = (rows, qk_dim + v_dim, useful_keys), 1
        dkv_shape = (keys, useful_rows, qk_dim + v_dim)
    s_dp = Work(
        sdp_shape,
        n * n_heads,
        prec,
        hbm_bytes=float(q_bytes + o_bytes + k_bytes + v_bytes + lse_bytes),
        kernel=fb,
        attention=shape,
    )
    # D = rowsum(dO * O) reads O
    softmax_b = replace(twice(softmax), hbm_bytes=float(o_bytes), kernel=fb)
    dq = Work(
        (rows, useful_keys, qk_dim),
        n_heads,
        prec,
        hbm_bytes=float(q_bytes),
        kernel=fb,
        attention=shape,
    )
    dkv = Work(
        dkv_shape, n * n_heads, prec, hbm_bytes=float(k_bytes + v_bytes), kernel=fb, attention=shape
    )
    return AttnStep(qk, softmax, pv, s_dp, softmax_b, dq, dkv)


def ring_steps(seq: int, cp: int) -> list[tuple[int, int, bool]]:
    """(query rows, keys, causal) per sequence of each of the ``cp`` ring steps."""
    c = max(seq // (2 * cp), 1)
    out = [(2 * c, 2 * c, True)]
    for i in range(1, cp):
        out.append((2 * c, c, False) if i % 2 else (c, 2 * c, False))
    return out


def shift_bytes(message: float, cp: int) -> float:
    """The all-gather size (nccl-tests convention) that moves ``message`` bytes per rank."""
    return message * cp / (cp - 1)


def _add(elems: int) -> Work:
    """An elementwise BF16 add into a running gradient: read both, write one."""
    return Work(vector_ops=float(elems), hbm_bytes=float(3 * ACT_BYTES * elems))


def ring_core(
    micro: int,
    seq: int,
    cp: int,
    heads: int,
    *,
    prec: str,
    qk_dim: int,
    v_dim: int,
    kv_heads: int,
) -> tuple[Callable[[str], list[Tpl]], list[Tpl]]:
    """The ring attention's forward (by phase) and backward templates; see the module doc."""
    b, a = micro, heads
    shapes = ring_steps(seq, cp)
    steps = [
        attention_step(
            b, a, r, k, causal=c, prec=prec, qk_dim=qk_dim, v_dim=v_dim, kv_heads=kv_heads
        )
        for r, k, c in shapes
    ]
    local = shapes[0][0]  # the rank's rows (and keys) per sequence: s / cp
    kv_message = float(ACT_BYTES * b * local * kv_heads * (qk_dim + v_dim))
    lse_corr = [
        Work(
            vector_ops=float(5 * b * r * a),  # max, min, subtract, add, copy
            scalar_ops=float(2 * b * r * a),  # exp and log
            hbm_bytes=float((2 * LSE_RUNNING_BYTES + LSE_BYTES) * b * r * a),
        )
        for r, _, _ in shapes
    ]
    out_elems = b * local * a * v_dim

    def merge(rows: int, first: bool) -> Work:
        elems = b * rows * a * v_dim
        # read the step's output, read and write the output; read both log-sum-exps
        hbm = 3 * ACT_BYTES * elems + (LSE_BYTES + LSE_RUNNING_BYTES) * b * rows * a
        if first:  # the output zeroed before the first add
            hbm += ACT_BYTES * out_elems
        return Work(
            vector_ops=float(2 * elems), scalar_ops=float(b * rows * a), hbm_bytes=float(hbm)
        )

    merges = [merge(r, i == 0) for i, (r, _, _) in enumerate(shapes)]
    shift = shift_bytes(kv_message, cp)

    def core(phase: str) -> list[Tpl]:
        out: list[Tpl] = []
        for i, st in enumerate(steps):
            if i + 1 < cp:
                out.append(async_coll("cp", "all_gather", phase, shift, ".kv"))
            out += [
                compute("attn.core.qk", phase, st.qk),
                compute("attn.core.softmax", phase, st.softmax),
                compute("attn.core.pv", phase, st.pv),
            ]
            if i > 0:
                out.append(compute("attn.core.lse", phase, lse_corr[i]))
            if i + 1 < cp:
                out.append(wait("cp", "all_gather", phase, ".kv"))
        out += [compute("attn.core.merge", phase, w) for w in merges]
        return out

    B = Phase.BACKWARD
    bwd: list[Tpl] = []
    for i, ((rows, keys, _), st) in enumerate(zip(shapes, steps, strict=True)):
        # step 0 sends K and V, the middle steps K, V, dK and dV, the last dK and dV
        message = kv_message * (2 if 0 < i < cp - 1 else 1)
        bwd.append(async_coll("cp", "all_gather", B, shift_bytes(message, cp), ".kv"))
        bwd += [
            compute("attn.core.bwd.qk_dp", B, st.s_dp),
            compute("attn.core.bwd.softmax", B, st.softmax_b),
            compute("attn.core.bwd.dq", B, st.dq),
            compute("attn.core.bwd.dkv", B, st.dkv),
        ]
        if i > 0:
            bwd.append(compute("attn.core.bwd.dq_add", B, _add(b * rows * a * qk_dim)))
        bwd.append(wait("cp", "all_gather", B, ".kv"))
        if i > 0:
            kv_elems = b * keys * kv_heads * (qk_dim + v_dim)
            bwd.append(compute("attn.core.bwd.dkv_add", B, _add(kv_elems)))
    return core, bwd
