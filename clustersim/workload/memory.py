"""Parameter counts and HBM use per rank: weights, gradients, optimizer state, activations.

Assumptions (mixed-precision training as in Megatron-LM and NeuronX Distributed):

- weights: bf16, 2 B per parameter the rank holds (its TP shard of its stage;
  the vocabulary padded to a multiple of 128*tp; KV heads replicated when
  tp > kv_heads; norm weights replicated on every TP rank);
- gradients: bf16, 2 B per parameter (Megatron's default ``grad_reduce_in_fp32
  = False``). ZeRO-1 keeps the whole gradient buffer on every rank. Under
  ``training.param_dtype: fp32`` (torch.autocast) weights and gradients take 4 B;
- optimizer: Adam with an FP32 master copy, 4 + 4 + 4 = 12 B per parameter (4 + 2
  + 2 = 8 B with ``training.optimizer_moments: bf16``, Megatron-Core's precision-aware
  optimizer), divided over the shard group under ZeRO-1 and above (ZeRO-2 and 3, with the
  gathered units and buffers they need: ``sharding``);
- activations: see ``layer_activation_bytes``. A stage holds the activations of
  as many microbatches as its schedule has in flight at its peak (1F1B:
  min(pp - stage, M); GPipe: M; interleaved, the peak of the model chunks whose
  forward has run and backward has not, each with its own layers), plus, for the
  layer being back-propagated, the intermediates that recompute regenerates;
- not counted here: the runtime's reserve (CUDA context, library workspaces,
  communication buffers) and the allocator's fragmentation, which the memory check
  adds (``workload.memcheck``, ``catalog.reserve``).
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.catalog.schema import ModelSpec
from clustersim.scenario.models import MoECfg, ParallelismCfg, TrainingCfg
from clustersim.workload.dims import (
    Dims,
    chunk_layers,
    is_moe_layer,
    make_dims,
    norm_params,
    optimizer_params,
    stage_layers,
    stage_pieces,
)
from clustersim.workload.gradbuckets import param_bytes
from clustersim.workload.layout import Layout
from clustersim.workload.mla import mla_activation_bytes, mla_layer_params
from clustersim.workload.moe import dispatch_buffer_bytes, moe_activation_bytes, stage_routing
from clustersim.workload.op_policy import op_activation_bytes
from clustersim.workload.overlap import a2a_overlap, recompute_beside
from clustersim.workload.recompute import DEFAULT_MODULES, OP_POLICY, modules_of
from clustersim.workload.schedules import peak_in_flight, stage_order
from clustersim.workload.sharding import adam_bytes, sharded_state
from clustersim.workload.templates import ACT_BYTES

__all__ = [
    "GRAD_BYTES_PER_PARAM",
    "OPTIMIZER_BYTES_PER_PARAM",
    "WEIGHT_BYTES_PER_PARAM",
    "MemoryBreakdown",
    "layer_activation_bytes",
    "memory_per_rank",
    "non_embedding_param_count",
    "param_count",
    "peak_memory",
    "rank_param_count",
    "stage_param_count",
]

WEIGHT_BYTES_PER_PARAM = 2
GRAD_BYTES_PER_PARAM = 2
OPTIMIZER_BYTES_PER_PARAM = 12
GIB = 2.0**30


# -- parameter counts (whole model, no sharding, no padding) ----------------------------


def _mlp_params(model: ModelSpec, width: int) -> int:
    return (3 if model.activation == "swiglu" else 2) * model.hidden * width


def _layer_params(model: ModelSpec, layer: int, *, active: bool = False) -> int:
    """Parameters of one layer; ``active`` counts only the experts a token uses."""
    h, d = model.hidden, model.head_dim
    if model.mla is None:
        attn = h * (model.heads + 2 * model.kv_heads) * d + model.heads * d * h
    else:
        attn = mla_layer_params(model, model.mla)
    norms = 2 * norm_params(model)
    moe = model.moe
    if moe is None or layer < moe.dense_layers:
        return attn + norms + _mlp_params(model, model.ffn_hidden)
    experts = (moe.top_k if active else moe.experts) + moe.shared_experts
    router = h * moe.experts
    return attn + norms + router + experts * _mlp_params(model, moe.expert_ffn_hidden)


def _embedding_params(model: ModelSpec) -> int:
    """The input lookup tables: tokens, and positions when they are learned."""
    pos = model.max_seq_len * model.hidden if model.position == "learned" else 0
    return model.vocab * model.hidden + pos


def param_count(model: ModelSpec) -> int:
    """Every parameter: layers, final norm, embeddings and (if untied) the LM head."""
    head = 0 if model.tied_embeddings else model.vocab * model.hidden
    layers = sum(_layer_params(model, i) for i in range(model.layers))
    return layers + norm_params(model) + _embedding_params(model) + head


def non_embedding_param_count(model: ModelSpec, *, active: bool = False) -> int:
    """Parameters other than the input embedding tables.

    An untied LM head counts (it is a matmul per token); a tied one is the
    embedding table and does not. ``active`` counts only the experts each token
    uses in MoE layers.
    """
    head = 0 if model.tied_embeddings else model.vocab * model.hidden
    layers = sum(_layer_params(model, i, active=active) for i in range(model.layers))
    return layers + norm_params(model) + head


def stage_param_count(model: ModelSpec, layout: Layout, stage: int) -> int:
    """Parameters of one pipeline stage, before TP sharding and vocabulary padding.

    A tied model's last stage counts its own copy of the table as the LM head
    (as Megatron keeps one when pp > 1), so the stages may sum to more than
    ``param_count``.
    """
    total = sum(_layer_params(model, i) for i in stage_layers(model, layout, stage))
    if stage == 0:
        total += _embedding_params(model)
    if layout.global_chunk(stage, layout.vp - 1) == layout.chunks - 1:  # the head's stage
        total += model.vocab * model.hidden + norm_params(model)
    return total


def rank_param_count(model: ModelSpec, layout: Layout, stage: int) -> int:
    """Parameters one rank of ``stage`` holds: its TP shard, with padding and replication."""
    return sum(n for _, _, n in stage_pieces(model, layout, stage))


# -- activations --------------------------------------------------------------------------


def layer_activation_bytes(
    dm: Dims, recompute: str, modules: frozenset[str] = DEFAULT_MODULES
) -> int:
    """Bytes one layer keeps for its backward, per microbatch, on one rank.

    Adapted from Korthikanti et al. (arXiv 2205.05198, section 4) to GQA, SwiGLU,
    flash attention and no dropout. With T = b*s/cp tokens, T_sp = T/tp under
    sequence parallelism (else T), h hidden, q = (a + 2g)*d the QKV width per rank,
    a the heads per rank, f the MLP width per rank, in bf16 (2 B) except what a
    linear layer keeps of its input, l B per element (``Dims.saved_input_bytes``: 1
    under FP8, where Transformer Engine keeps the quantized copy, else 2):

    - attention: the norm's input (2*T_sp*h) and the fused norm-linear's normed
      input (l*T_sp*h, a sequence shard gathered again in backward); Q, K and V
      after RoPE (the flash-attention inputs; K and V of the local CP chunk only):
      2*T*q; the attention output O, also the output projection's input (2*T*a*d;
      under FP8 the projection's own copy, l*T*a*d, too), and the FP32 log-sum-exp
      (4*T*a);
    - MLP (``_mlp_activation_bytes``): its norm's input and normed input
      (2*T_sp*h + l*T_sp*h); SwiGLU keeps gate and up (2*T*2f) and the down
      projection's input (l*T*f); GeLU its input (2*T*f) and output (l*T*f).

    Flash attention never stores the s x s scores, so Korthikanti's 5as²b term is
    gone; without dropout so are the masks. For classic GPT (a = g, f = 4h, GeLU)
    in BF16 this gives 32*s*b*h/tp, their 34 less the two dropout masks.

    ``selective`` recompute reruns ``modules`` (``workload.recompute``): ``core_attn``
    does not keep O and the log-sum-exp, ``mlp`` keeps only the MLP's input. ``full``
    keeps only the layer's input, 2*T_sp*h. torchtitan's op policy (``modules`` is
    ``OP_POLICY``) keeps what ``workload.op_policy`` counts.
    """
    T, Ts, h = dm.tokens, dm.sp_tokens, dm.hidden
    if recompute == "full":
        return 2 * Ts * h
    if recompute == "selective" and modules == OP_POLICY:
        return op_activation_bytes(dm)
    mods = modules if recompute == "selective" else frozenset()
    mlp = _mlp_activation_bytes(dm, recompute, mods)
    if dm.mla is not None:
        return mla_activation_bytes(dm, dm.mla, recompute, mods) + mlp
    lin = dm.saved_input_bytes
    total = (2 + lin) * Ts * h + 2 * T * dm.qkv_cols + mlp
    if lin < ACT_BYTES:  # the output projection's FP8 copy of O
        total += lin * T * dm.attn_cols
    if "core_attn" not in mods:
        total += 2 * T * dm.attn_cols + 4 * T * dm.heads_local
    return total


def _held(
    schedule: str,
    stage: int,
    layout: Layout,
    n_mb: int,
    per_chunk: list[int],
    *,
    overlap: bool = False,
) -> float:
    """The peak of activations in flight: in closed form for one chunk per stage (1F1B
    holds min(pp - stage, M) microbatches, twice as many with overlapped all-to-alls; GPipe
    all M), else by walking the order."""
    if layout.vp == 1 and schedule in ("1f1b", "gpipe"):
        live = layout.pp - stage
        if overlap:  # stage_order's deeper warm-up
            live = 2 * live
        live = min(live, n_mb) if schedule == "1f1b" else n_mb
        return float(live * per_chunk[0])
    order = stage_order(schedule, stage, layout.pp, n_mb, layout.vp, overlap=overlap)
    return peak_in_flight(order, per_chunk)


def _mlp_activation_bytes(
    dm: Dims, recompute: str, modules: frozenset[str] = DEFAULT_MODULES
) -> int:
    """The dense MLP's share of ``layer_activation_bytes``: its norm input, its up
    projection's input, the gate and up outputs and the down projection's input;
    with ``mlp`` recompute, only the norm's input (the checkpoint's)."""
    if recompute == "full":
        return 0
    Ts, h, lin = dm.sp_tokens, dm.hidden, dm.saved_input_bytes
    if recompute == "selective" and "mlp" in modules:
        return 2 * Ts * h
    return (2 + lin) * Ts * h + 2 * dm.tokens * dm.up_cols + lin * dm.tokens * dm.ffn_local


def _head_activation_bytes(dm: Dims) -> int:
    """The last stage's final-norm and LM-head inputs, and the FP32 softmax of the logits."""
    return 2 * 2 * dm.sp_tokens * dm.hidden + 4 * dm.tokens * dm.vocab_local


# -- memory per rank ------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryBreakdown:
    """HBM bytes one rank uses, by kind."""

    weights: float
    grads: float
    optimizer: float
    activations: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations


def memory_per_rank(
    model: ModelSpec,
    par: ParallelismCfg,
    train: TrainingCfg,
    layout: Layout,
    stage: int,
    *,
    moe: MoECfg | None = None,
    seed: int = 0,
) -> MemoryBreakdown:
    """HBM bytes one rank of ``stage`` needs (see the module docstring for assumptions).

    ``moe`` and ``seed`` set MoE layers' token routing: the busiest rank's loads.
    """
    adam = adam_bytes(train.optimizer_moments)
    state = sharded_state(model, par, layout, stage, adam=adam)
    scale = param_bytes(train) / WEIGHT_BYTES_PER_PARAM  # FP32 parameters (zero 0, 1)
    optimizer = state.optimizer
    if model.moe is not None:  # the experts' Adam state: over their shard group, not dp
        optimizer = float(adam * optimizer_params(model, layout, stage, par.zero))
    dm = make_dims(model, par, train, layout)
    n_mb = train.global_batch_size // (layout.dp * par.microbatch_size)
    # What one microbatch's forward of each local chunk leaves in HBM until its backward.
    mods = modules_of(par)
    per_layer = layer_activation_bytes(dm, par.recompute, mods)
    full = layer_activation_bytes(dm, "none")
    per_moe, moe_full, buffers = per_layer, full, 0
    if model.moe is not None:
        route = stage_routing(model, par, train, layout, cfg=moe, seed=seed)
        # The attention half as in a dense layer; the MoE half replaces the MLP's.
        attn = per_layer - _mlp_activation_bytes(dm, par.recompute, mods)
        per_moe = attn + moe_activation_bytes(dm, model.moe, route, par.recompute, mods)
        moe_full = full - _mlp_activation_bytes(dm, "none")
        moe_full += moe_activation_bytes(dm, model.moe, route, "none")
        buffers = dispatch_buffer_bytes(dm, route)
    per_chunk = [
        sum(
            per_moe if is_moe_layer(model, i) else per_layer
            for i in chunk_layers(model, layout, stage, k)
        )
        for k in range(layout.vp)
    ]
    if layout.global_chunk(stage, layout.vp - 1) == layout.chunks - 1:
        per_chunk[-1] += (1 + model.mtp_layers) * _head_activation_bytes(dm)
    overlap = a2a_overlap(par, model, layout)
    if overlap:  # two microbatches' all-to-alls in flight
        buffers *= 2
    held = _held(par.schedule, stage, layout, n_mb, per_chunk, overlap=overlap)
    # The layer in backward holds everything recompute regenerated for it, and an MoE
    # layer's all-to-all its send and receive buffers; where the next layer's recompute
    # runs beside that backward (``overlap.recompute_beside``), that layer's too.
    has_moe = any(is_moe_layer(model, i) for i in stage_layers(model, layout, stage))
    transient = max(full - per_layer, (moe_full - per_moe + buffers) if has_moe else 0)
    if recompute_beside(par, dm):  # the next layer's recompute runs beside it
        transient += full - per_layer
    return MemoryBreakdown(
        weights=state.weights * scale,
        grads=state.grads * scale,
        optimizer=optimizer,
        activations=float(held + transient),
    )


def peak_memory(
    model: ModelSpec, par: ParallelismCfg, train: TrainingCfg, layout: Layout
) -> MemoryBreakdown:
    """The breakdown of the stage whose ranks need the most HBM."""
    per_stage = [memory_per_rank(model, par, train, layout, k) for k in range(layout.pp)]
    return max(per_stage, key=lambda m: m.total)
