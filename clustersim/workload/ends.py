"""The blocks around a stage's layers: the embedding, the LM head with its
cross-entropy, and a multi-token-prediction module's own ops (their layers are the
model's, ``workload.ops``)."""

from __future__ import annotations

from clustersim.hardware.work import Work
from clustersim.workload.dims import Dims
from clustersim.workload.elementwise import norm_work as _norm
from clustersim.workload.ops import Block, _Linear
from clustersim.workload.program import Phase
from clustersim.workload.templates import ACT_BYTES, Tpl
from clustersim.workload.templates import coll as _coll
from clustersim.workload.templates import compute as _compute
from clustersim.workload.templates import twice as _twice
from clustersim.workload.tp_comm import TPComm

__all__ = ["embed_block", "head_block", "mtp_block"]


def embed_block(dm: Dims) -> Block:
    """The first stage's vocab-parallel embedding lookup (and learned positions).

    Each TP rank looks up the tokens in its vocabulary shard and writes zeros for
    the others; the shards are summed by a reduce-scatter (sequence parallel) or
    an all-reduce. Its backward is a scatter-add into the table's gradient.
    """
    T, h = dm.tokens, dm.hidden
    elems = T * h
    hbm = ACT_BYTES * (elems // dm.tp + elems)  # rows hit in this shard, full output
    vector = float(elems)  # zero the rows owned by other shards
    if dm.learned_positions:
        hbm += 2 * ACT_BYTES * elems
        vector += elems
    work = Work(vector_ops=vector, hbm_bytes=float(hbm))
    tp = TPComm(dm)
    F, B = Phase.FORWARD, Phase.BACKWARD
    fwd = [_compute("embed", F, work), *tp.exit_fwd(F)]
    bwd = [*tp.exit_bwd(), _compute("embed", B, _twice(work))]
    pieces = ("embed", "pos_embed") if dm.learned_positions else ("embed",)
    return Block(tuple(fwd), tuple(bwd), (), {len(bwd) - 1: pieces})


def mtp_block(dm: Dims, precision: str) -> Block:
    """A multi-token-prediction module's own ops, before its transformer layer.

    RMSNorm of the main model's hidden state and of the next token's embedding (the
    shared table, a lookup), their concatenation projected from 2 h to h (split over
    TP like the MLP's up projection; its exchange is left to the layer's own). The
    layer and the second pass of the LM head are lowered as the model's.
    """
    T, h = dm.tokens, dm.hidden
    norm = _norm(dm, dm.sp_tokens)
    proj = _Linear.of(T, 2 * h, h // dm.tp, precision)
    F, B = Phase.FORWARD, Phase.BACKWARD
    fwd: tuple[Tpl, ...] = (
        _compute("mtp.norm", F, norm),
        _compute("mtp.embed_norm", F, norm),
        _compute("mtp.proj", F, proj.fwd),
    )
    bwd: tuple[Tpl, ...] = (
        _compute("mtp.proj.dgrad", B, proj.dgrad),
        _compute("mtp.proj.wgrad", B, proj.wgrad),
        _compute("mtp.norm", B, _twice(norm)),
        _compute("mtp.embed_norm", B, _twice(norm)),
    )
    return Block(fwd, bwd, (), {})


def head_block(dm: Dims) -> Block:
    """The last stage's final norm, LM head and vocab-parallel cross-entropy.

    With tp > 1 the cross-entropy needs three all-reduces of one FP32 value per
    token across TP (Megatron's vocab-parallel cross-entropy: the row max, the
    target logit and the sum of exponentials).
    """
    T, h, V = dm.tokens, dm.hidden, dm.vocab_local
    tp = TPComm(dm)
    norm = _norm(dm, dm.sp_tokens)
    head = _Linear.of(T, h, V, "bf16")
    logits = T * V
    # Read the bf16 logits, keep the FP32 softmax for the backward.
    loss = Work(scalar_ops=float(logits), vector_ops=float(3 * logits), hbm_bytes=6.0 * logits)
    loss_b = Work(vector_ops=float(2 * logits), hbm_bytes=6.0 * logits)
    F, B = Phase.FORWARD, Phase.BACKWARD
    fwd: list[Tpl] = [
        _compute("final_norm", F, norm),
        *tp.enter_fwd(F),
        _compute("lm_head", F, head.fwd),
        _compute("loss", F, loss),
    ]
    if dm.tp > 1:
        fwd += [_coll("tp", "all_reduce", F, 4 * T, ".loss") for _ in range(3)]
    bwd: list[Tpl] = [
        _compute("loss", B, loss_b),
        _compute("lm_head.dgrad", B, head.dgrad),
        _compute("lm_head.wgrad", B, head.wgrad),
    ]
    ready = {len(bwd) - 1: ("lm_head",)}
    bwd += [*tp.enter_bwd(), _compute("final_norm", B, _twice(norm))]
    ready[len(bwd) - 1] = ("final_norm",)
    return Block(tuple(fwd), tuple(bwd), (), ready)
