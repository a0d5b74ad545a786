"""Per-rank tensor dimensions and parameter shards of a dense transformer.

One place decides how a model is cut across tensor parallelism, so the lowering
(``ops``), the memory model and the gradient buckets agree on every shape:

- attention heads and the MLP width are split over ``tp`` (Megatron column/row
  parallel linears); KV heads too, except when ``tp`` exceeds ``kv_heads``: each
  rank then holds one KV head, replicated ``tp / kv_heads`` times (as NeuronX
  Distributed does), so the QKV weight has ``(heads + 2 * max(kv_heads, tp)) *
  head_dim / tp`` columns per rank;
- the vocabulary is padded up to a multiple of ``128 * tp`` (Megatron's
  ``make_vocab_size_divisible_by`` times ``tp``) and split over ``tp``;
- norm weights are replicated on every TP rank;
- linear layers have no biases (Llama style); LayerNorm has weight and bias.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from clustersim.catalog.schema import MLASpec, ModelSpec
from clustersim.scenario.models import ParallelismCfg, TrainingCfg
from clustersim.workload.layout import Layout

__all__ = [
    "EXPERT_PIECES",
    "VOCAB_PAD",
    "Dims",
    "attention_pieces",
    "chunk_layers",
    "embed_pieces",
    "head_pieces",
    "is_moe_layer",
    "kv_heads_per_rank",
    "layer_pieces",
    "make_dims",
    "moe_layer_pieces",
    "norm_params",
    "optimizer_params",
    "padded_vocab",
    "stage_layer_counts",
    "stage_layers",
    "stage_pieces",
]

EXPERT_PIECES = ("moe.experts.down", "moe.experts.up")
"""Parameter pieces of the routed experts: reduced and sharded over ``edp``, not ``dp``."""

VOCAB_PAD = 128
"""Megatron pads the vocabulary to a multiple of ``VOCAB_PAD * tp``."""


def padded_vocab(vocab: int, tp: int) -> int:
    """The vocabulary size after padding to a multiple of ``128 * tp``."""
    multiple = VOCAB_PAD * tp
    return -(-vocab // multiple) * multiple


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """KV heads held by one TP rank: at least one, replicated when ``tp > kv_heads``."""
    return max(model.kv_heads // tp, 1)


def norm_params(model: ModelSpec) -> int:
    """Parameters of one norm: RMSNorm has a weight, LayerNorm a weight and a bias."""
    return model.hidden * (2 if model.norm == "layernorm" else 1)


def _mlp_up_cols(model: ModelSpec) -> int:
    # SwiGLU's gate and up projections run as one matmul of twice the width.
    return (2 if model.activation == "swiglu" else 1) * model.ffn_hidden


def layer_pieces(model: ModelSpec, tp: int) -> tuple[tuple[str, int], ...]:
    """Parameters of one dense layer held by one TP rank, per weight.

    Listed in the order their gradients complete in the backward pass (the MLP
    first), which is the order gradient buckets fill.
    """
    h = model.hidden
    norm = norm_params(model)
    return (
        ("mlp.down", model.ffn_hidden // tp * h),
        ("mlp.up", h * _mlp_up_cols(model) // tp),
        ("mlp.norm", norm),
        *attention_pieces(model, tp),
    )


def moe_layer_pieces(model: ModelSpec, layout: Layout) -> tuple[tuple[str, int], ...]:
    """One rank's parameters of an MoE layer, in gradient completion order.

    The rank holds ``experts / ep`` routed experts, each split over ``etp``; the
    shared experts are split over TP like a dense MLP; the router is replicated.
    """
    moe = model.moe
    assert moe is not None  # callers check
    h, f = model.hidden, moe.expert_ffn_hidden
    up = (2 if model.activation == "swiglu" else 1) * h
    local, f_l = moe.experts // layout.ep, f // layout.etp
    out: list[tuple[str, int]] = []
    if moe.shared_experts:
        fs = moe.shared_experts * f // layout.tp
        out += [("moe.shared.down", fs * h), ("moe.shared.up", up * fs)]
    out += [("moe.experts.down", local * f_l * h), ("moe.experts.up", local * up * f_l)]
    out += [("moe.router", h * moe.experts), ("mlp.norm", norm_params(model))]
    return (*out, *attention_pieces(model, layout.tp))


def is_moe_layer(model: ModelSpec, layer: int) -> bool:
    """Whether ``layer`` has a mixture of experts (past the model's dense-first layers)."""
    return model.moe is not None and layer >= model.moe.dense_layers


def attention_pieces(model: ModelSpec, tp: int) -> tuple[tuple[str, int], ...]:
    """One TP rank's attention parameters, in gradient completion order (the output first).

    Under MLA (``clustersim.workload.mla``) the down-projections and latent norms are
    replicated on every TP rank; the up-projections and the output are split by heads.
    """
    h, d, a = model.hidden, model.head_dim, model.heads // tp
    norm = norm_params(model)
    mla = model.mla
    if mla is None:
        qkv_cols = (a + 2 * kv_heads_per_rank(model, tp)) * d
        return (("attn.out", a * d * h), ("attn.qkv", h * qkv_cols), ("attn.norm", norm))
    q_in = mla.q_lora_rank or h  # without query compression, queries come from h
    up = q_in * a * mla.qk_head_dim + mla.kv_lora_rank * a * (mla.qk_nope_head_dim + mla.v_head_dim)
    down = h * (mla.q_lora_rank + mla.kv_lora_rank + mla.qk_rope_head_dim)
    return (
        ("attn.out", a * mla.v_head_dim * h),
        ("attn.up", up),
        ("attn.latent_norm", mla.q_lora_rank + mla.kv_lora_rank),
        ("attn.down", down),
        ("attn.norm", norm),
    )


def head_pieces(model: ModelSpec, tp: int) -> tuple[tuple[str, int], ...]:
    """Parameters of the last stage's head (LM head, final norm) on one TP rank."""
    return (
        ("lm_head", padded_vocab(model.vocab, tp) // tp * model.hidden),
        ("final_norm", norm_params(model)),
    )


def embed_pieces(model: ModelSpec, tp: int) -> tuple[tuple[str, int], ...]:
    """Parameters of the first stage's embeddings on one TP rank.

    The token table is vocab-parallel; a learned position table (``max_seq_len``
    rows) is replicated, as in Megatron.
    """
    pieces = [("embed", padded_vocab(model.vocab, tp) // tp * model.hidden)]
    if model.position == "learned":
        pieces.append(("pos_embed", model.max_seq_len * model.hidden))
    return tuple(pieces)


def stage_layer_counts(layers: int, pp: int) -> list[int]:
    """Layers per stage: equal shares, or as even as possible when pp does not divide them.

    The extra layers of an uneven split go to the middle stages first, then the
    last, then the first: the outer stages also hold the embedding and the LM
    head, so they get the lighter share (as Llama 3 405B did, 126 layers on 16
    stages: 7 on the first and last, 8 on the others).
    """
    base, extra = divmod(layers, pp)
    counts = [base] * pp
    order = [*range(1, pp - 1), pp - 1, 0] if pp > 1 else [0]
    for stage in order[:extra]:
        counts[stage] += 1
    return counts


def chunk_layers(model: ModelSpec, layout: Layout, stage: int, chunk: int) -> range:
    """Global indices of the layers of ``stage``'s local model chunk ``chunk``.

    The layers are cut into ``pp x vp`` contiguous chunks (:func:`stage_layer_counts`
    over chunks); chunk ``c`` runs on stage ``c % pp``, as its local chunk ``c // pp``
    (in a V, ``Layout.global_chunk``).
    """
    if not 0 <= stage < layout.pp:
        raise ValueError(f"stage {stage} out of range 0..{layout.pp - 1}")
    if not 0 <= chunk < layout.vp:
        raise ValueError(f"chunk {chunk} out of range 0..{layout.vp - 1}")
    c = layout.global_chunk(stage, chunk)
    counts = stage_layer_counts(model.blocks, layout.chunks)
    start = sum(counts[:c])
    return range(start, start + counts[c])


def stage_layers(model: ModelSpec, layout: Layout, stage: int) -> Sequence[int]:
    """Global indices of the layers that ``stage`` owns: a contiguous share per chunk."""
    if layout.vp == 1:
        return chunk_layers(model, layout, stage, 0)
    return [i for k in range(layout.vp) for i in chunk_layers(model, layout, stage, k)]


def stage_pieces(model: ModelSpec, layout: Layout, stage: int) -> list[tuple[int, str, int]]:
    """(layer, piece, parameters on one rank) of a stage, in gradient completion order.

    The backward runs the head first, then the layers last to first, then the
    embedding; ``layer`` is -1 for the head and the embedding. With several model
    chunks the last chunk's gradients complete first (the schedule's last backwards
    run the chunks in reverse).
    """
    tp = layout.tp
    out: list[tuple[int, str, int]] = []
    pieces = layer_pieces(model, tp)
    moe = moe_layer_pieces(model, layout) if model.moe is not None else pieces
    for chunk in reversed(range(layout.vp)):
        if layout.global_chunk(stage, chunk) == layout.chunks - 1:
            out += [(-1, name, n) for name, n in head_pieces(model, tp)]
        for layer in reversed(chunk_layers(model, layout, stage, chunk)):
            mine = moe if is_moe_layer(model, layer) else pieces
            out += [(layer, name, n) for name, n in mine]
        if layout.global_chunk(stage, chunk) == 0:
            out += [(-1, name, n) for name, n in embed_pieces(model, tp)]
    return out


@dataclass(frozen=True, slots=True)
class Dims:
    """The shapes one rank works on for one microbatch.

    ``tokens`` (T = b*s/cp) are the rows of every linear layer's matmul;
    ``sp_tokens`` (T/tp with sequence parallelism, else T) are the tokens that
    norms, residual adds and pipeline messages touch.
    """

    tp: int
    cp: int
    micro: int  # b: sequences per microbatch
    seq: int  # s: sequence length
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    vocab_padded: int
    sequence_parallel: bool
    swiglu: bool
    layernorm: bool
    learned_positions: bool
    mla: MLASpec | None = None
    etp: int = 1  # expert tensor parallelism (MoE layers)
    fp8_scaling: str = "delayed"  # training.fp8.scaling
    cp_comm_type: str = "all_gather"  # parallelism.cp_comm_type
    precision: str = "bf16"  # training.precision
    tp_overlap: str = "blocking"  # parallelism.tp_comm_overlap (workload.ops._TP)
    attention_dropout: float = 0.0  # model.attention_dropout (unfused attention pays it)
    causal: bool = True  # model.causal (flash attention's useful half of the square)

    @property
    def saved_input_bytes(self) -> int:
        """Bytes per element of what a linear layer keeps of its input for the weight
        gradient: its FP8 copy under an FP8 recipe (Transformer Engine saves the
        quantized input), else the BF16 input itself."""
        return 1 if self.precision == "fp8" else 2

    @property
    def tokens(self) -> int:
        return self.micro * self.seq // self.cp

    @property
    def sp_tokens(self) -> int:
        return self.tokens // self.tp if self.sequence_parallel else self.tokens

    @property
    def q_rows(self) -> int:
        """Query rows of one sequence on this rank (s / cp)."""
        return self.seq // self.cp

    @property
    def heads_local(self) -> int:
        return self.heads // self.tp

    @property
    def kv_heads_local(self) -> int:
        return max(self.kv_heads // self.tp, 1)

    @property
    def ffn_local(self) -> int:
        return self.ffn // self.tp

    @property
    def vocab_local(self) -> int:
        return self.vocab_padded // self.tp

    @property
    def qkv_cols(self) -> int:
        return (self.heads_local + 2 * self.kv_heads_local) * self.head_dim

    @property
    def up_cols(self) -> int:
        return (2 if self.swiglu else 1) * self.ffn_local

    @property
    def attn_cols(self) -> int:
        """Width of the attention output on this rank (local heads x head_dim)."""
        return self.heads_local * self.head_dim


def make_dims(model: ModelSpec, par: ParallelismCfg, train: TrainingCfg, layout: Layout) -> Dims:
    """The per-rank shapes; sizes (tp, cp) come from ``layout``, the rest from the config."""
    return Dims(
        tp=layout.tp,
        cp=layout.cp,
        micro=par.microbatch_size,
        seq=train.seq_len,
        hidden=model.hidden,
        heads=model.heads,
        kv_heads=model.kv_heads,
        head_dim=model.head_dim,
        ffn=model.ffn_hidden,
        vocab=model.vocab,
        vocab_padded=padded_vocab(model.vocab, layout.tp),
        # Sequence parallelism only changes anything when there is tensor parallelism.
        sequence_parallel=par.sequence_parallel and layout.tp > 1,
        swiglu=model.activation == "swiglu",
        layernorm=model.norm == "layernorm",
        learned_positions=model.position == "learned",
        mla=model.mla,
        etp=layout.etp,
        fp8_scaling=train.fp8.scaling,
        cp_comm_type=par.cp_comm_type or "all_gather",
        precision=train.precision,
        tp_overlap=par.tp_comm_overlap or "blocking",
        attention_dropout=model.attention_dropout,
        causal=model.causal,
    )


def optimizer_params(model: ModelSpec, layout: Layout, stage: int, zero: int) -> int:
    """Parameters whose Adam step one rank runs: with ZeRO its shard of the stage's
    dense parameters over its gradient group (``Layout.grad_group``: ``dp_cp`` under
    context parallelism, else ``dp_shard``) and of its experts' over their shard group
    (``edp``, or ``edp_shard`` under hybrid sharding)."""
    pieces = stage_pieces(model, layout, stage)
    expert = sum(n for _, name, n in pieces if name in EXPERT_PIECES)
    dense = sum(n for _, _, n in pieces) - expert
    if zero >= 1:
        return -(-dense // layout.optimizer_shard(zero)) + -(-expert // layout.expert_shard)
    return dense + expert
