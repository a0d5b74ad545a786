"""The time of one engine iteration on one tensor-parallel replica.

An iteration runs every layer of the model once over a batch: some prompt chunks
being prefilled and some sequences decoding one token each. On each of the
replica's ``tp`` ranks a layer is one pipelined op (the chip model's roofline,
:class:`~clustersim.hardware.chip.ChipModel`):

- compute: the layer's four GEMMs (QKV, output projection, gate and up, down) on
  ``T`` token rows: on a GPU each is the measured time of the engine's own kernel
  (vLLM's CUTLASS FP8 ``scaled_mm`` for ``vllm``, TensorRT-LLM's for the others:
  :func:`~clustersim.hardware.kernels.gemm_table`), on Trainium the chip model's
  roofline (``ChipModel.op_time(Work(...))``),
  plus prefill attention (QK^T and PV per local head, at the fused attention
  kernel's efficiency, over the causal context the chunk sees);
- HBM: the rank's shard of the layer's weights, the KV cache every sequence reads
  (decodes and chunks with earlier context) and the KV it writes; on a GPU the
  decoding sequences' attention is instead the engine's measured decode kernel
  (:mod:`~clustersim.hardware.decode_kernels`: its KV reads, launch and tail, at the
  batch and the mean cached tokens per sequence) where the layout was measured;

and lasts ``max(compute, HBM)`` plus the chip's per-op overhead
(``calibration.op_overhead_s``, 5 ops per layer) plus two tensor-parallel
all-reduces of the ``T x hidden`` activations (after attention and after the MLP,
Megatron's layout): on a GPU node the engine's measured all-reduce kernel, elsewhere
the project's collective model (:mod:`clustersim.serve.collectives`), plus
``fixed_per_layer_s`` (0: no published per-layer serving overhead was found to take
it from). The LM head runs once per iteration on the sequences that produce a token.
On Trainium and Inferentia a decode step's attention adds, after the layer's pipelined
op, its instructions on the NeuronCore's engines (:mod:`clustersim.serve.decode_attention`:
one query row per head against each sequence's keys, about ``L`` cycles a pass however
few rows), on the critical path between the QKV and output projections. A layer of a
mixture-of-experts model runs its routed experts (:mod:`clustersim.serve.moe`).

Not modelled: norms, rotary embeddings, sampling, the logits' gather, CPU-side
scheduling and the KV block tables' indirection.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from clustersim.catalog.schema import ModelSpec
from clustersim.errors import ScenarioError
from clustersim.hardware.chip import HBM, ChipModel
from clustersim.hardware.decode_kernels import DecodeTable, decode_table
from clustersim.hardware.kernels import AttentionTable, GemmTable, attention_table, gemm_table
from clustersim.hardware.moe_kernels import MoeTable, moe_table
from clustersim.hardware.work import Work
from clustersim.serve.decode_attention import DecodeAttention
from clustersim.serve.moe import experts_of

__all__ = ["DTYPE_BYTES", "OPS_PER_LAYER", "IterationModel", "kv_bytes_per_token"]

DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
OPS_PER_LAYER = 5
"""QKV, attention, output projection, gate-up, down: each pays the chip's op overhead."""
GPU_SMALL_KERNELS = 6
"""The kernels of a Llama layer beside its four GEMMs in vLLM and TensorRT-LLM: two
fused residual-add RMSNorms, the rotary embedding, the KV-cache write, attention and
SiLU-and-multiply (vLLM ``model_executor/models/llama.py``, ``LlamaDecoderLayer``);
each pays the chip's op overhead (a kernel's launch and tail)."""
DECODE_SHAPES = 65536
"""Decode-only iteration shapes kept (a continuous batch's contexts take many values)."""
ACT_BYTES = 2
"""Activations (and so the TP all-reduces) are 16-bit at every compute precision."""


def kv_bytes_per_token(model: ModelSpec, kv_dtype: str, tp: int = 1) -> float:
    """KV cache bytes one token takes on one of ``tp`` ranks, all layers.

    ``2 x layers x kv_heads x head_dim x bytes / tp`` (K and V, each ``kv_heads x
    head_dim`` per token and layer). Above ``kv_heads`` ranks each rank holds one KV
    head, replicated (as NxD Inference does at TP 32-64 on GQA models); a tp that
    neither divides nor is a multiple of ``kv_heads`` is refused. Query heads and the
    MLP width are padded up to a multiple of tp instead (a rank's share rounded up).
    """
    if model.kv_heads % tp and tp % model.kv_heads:
        raise ScenarioError(
            "parallelism.tp",
            tp,
            f"must divide the model's {model.kv_heads} KV heads or be a multiple of them",
        )
    heads_per_rank = max(model.kv_heads // tp, 1)
    return 2.0 * model.layers * heads_per_rank * model.head_dim * DTYPE_BYTES[kv_dtype]


@dataclass(frozen=True)
class _Shapes:
    """One rank's share of a layer: GEMM (k, n) shapes, weight bytes, local heads."""

    gemms: tuple[tuple[int, int], ...]
    weight_bytes: float
    heads: int
    kv_heads: int
    head_dim: int
    kv_token_bytes: float  # one token's K and V of one layer on this rank
    lm_head: tuple[int, int]
    lm_head_bytes: float
    moe_gemms: tuple[tuple[int, int], ...] = ()
    """A MoE layer's GEMMs besides the routed experts: QKV, output projection, the
    router and the shared experts (empty for a dense model)."""
    moe_weight_bytes: float = 0.0


def _shapes(model: ModelSpec, tp: int, weight_dtype: str, kv_dtype: str) -> _Shapes:
    if model.mla is not None:
        raise ScenarioError("model", model.name, "serving models GQA attention only (no MLA yet)")
    if not model.causal:
        raise ScenarioError(
            "model", model.name, "an encoder (model.causal: false) generates no tokens to serve"
        )
    # Heads and the MLP width that tp does not divide are padded up to a multiple of
    # it (Llama-3-70B's 64 heads at TP 24 on inf2.48xlarge, as the Neuron benchmark
    # tables run it: aws-neuron-sdk about-neuron/benchmarks/inf2).
    heads = math.ceil(model.heads / tp)
    h, hd = model.hidden, model.head_dim
    q = heads * hd
    kv = max(model.kv_heads // tp, 1) * hd
    ffn = math.ceil(model.ffn_hidden / tp)
    up = 2 * ffn if model.activation == "swiglu" else ffn
    gemms = ((h, q + 2 * kv), (q, h), (h, up), (ffn, h))
    wbytes = DTYPE_BYTES[weight_dtype]
    params = sum(k * n for k, n in gemms)
    vocab = math.ceil(model.vocab / tp)
    moe_gemms: tuple[tuple[int, int], ...] = ()
    if model.moe is not None:
        # the router's (h, experts) GEMM runs replicated on every rank; shared experts
        # are one dense MLP of their summed width, split as the dense MLP is
        moe_gemms = ((h, q + 2 * kv), (q, h), (h, model.moe.experts))
        if model.moe.shared_experts:
            shared = math.ceil(model.moe.shared_experts * model.moe.expert_ffn_hidden / tp)
            moe_gemms += ((h, 2 * shared), (shared, h))
    return _Shapes(
        moe_gemms=moe_gemms,
        moe_weight_bytes=sum(k * n for k, n in moe_gemms) * wbytes,
        gemms=gemms,
        weight_bytes=params * wbytes,
        heads=heads,
        kv_heads=max(model.kv_heads // tp, 1),
        head_dim=hd,
        kv_token_bytes=kv_bytes_per_token(model, kv_dtype, tp) / model.layers,
        lm_head=(h, vocab),
        lm_head_bytes=h * vocab * wbytes,
    )


def _attention_key(kv_dtype: str) -> str:
    """The measured attention table's precision for a KV cache dtype."""
    return "fp8" if DTYPE_BYTES[kv_dtype] == 1 else "bf16"


class IterationModel:
    """Iteration times of one replica: ``tp`` ranks of ``chip`` serving ``model``.

    ``allreduce_s(nbytes)`` is the time of one all-reduce of ``nbytes`` over the
    replica's ranks (0 for tp 1). With ``attention_dp`` > 1 it is one attention
    data-parallel group's: the MoE layers' experts are spread over ``attention_dp x tp``
    ranks and take every group's tokens, exchanged by ``dp_gather_s(nbytes)`` (the
    all-gather and reduce-scatter of the whole gathered buffer). ``kernels`` names
    the engine whose measured GEMMs a GPU runs (``"vllm"``: vLLM's own,
    :func:`~clustersim.hardware.kernels.gemm_table`; None: the chip's default tables).
    """

    def __init__(
        self,
        model: ModelSpec,
        chip: ChipModel,
        tp: int,
        *,
        precision: str = "bf16",
        weight_dtype: str = "bf16",
        kv_dtype: str = "bf16",
        allreduce_s: Callable[[float], float] = lambda _n: 0.0,
        fixed_per_layer_s: float = 0.0,
        launch_s: float = 0.0,
        kernels: str | None = None,
        ep: int = 1,
        pp: int = 1,
        stage_send_s: Callable[[int], float] | None = None,
        attention_dp: int = 1,
        dp_gather_s: Callable[[float], float] = lambda _n: 0.0,
    ) -> None:
        self.model = model
        self.chip = chip
        self.tp = tp
        self.precision = precision
        self.shapes = _shapes(model, tp, weight_dtype, kv_dtype)
        self.allreduce_s = allreduce_s
        self.fixed_per_layer_s = fixed_per_layer_s
        self.op_overhead_s = chip.spec.calibration.op_overhead_s
        self.launch_s = launch_s
        self.kv_dtype = kv_dtype
        self.kernels = kernels
        self.ep = ep
        self.pp = pp
        self.stage_layers = math.ceil(model.layers / pp)
        """The most layers one pipeline stage holds (what a rank's memory must take)."""
        self.stage_send_s = stage_send_s
        self.attention_dp = attention_dp
        self.dp_gather_s = dp_gather_s
        self.experts = experts_of(model, tp * attention_dp, ep, DTYPE_BYTES[weight_dtype])
        dense = model.moe.dense_layers if model.moe is not None else model.layers
        self.dense_layers = min(dense, model.layers)
        self.moe_layers = model.layers - self.dense_layers
        self.kernel_engine = "vllm" if kernels == "vllm" else "trtllm"
        """Whose measured kernels (MoE, decode attention) the layers run."""
        self.moe_table: MoeTable | None = None
        self.decode_attention: DecodeAttention | None = None
        if chip.spec.family != "gpu" and chip.spec.engines is not None:
            s = self.shapes
            group = max(s.heads // s.kv_heads, 1)
            self.decode_attention = DecodeAttention(chip.spec, chip.lnc, s.kv_heads, group)
        # GPUs run a layer as a sequence of kernels, each timed by its measurement where
        # the chip has one (module doc); Trainium runs it as one pipelined program.
        self.gemm_table: GemmTable | None = None
        self.attention_table: AttentionTable | None = None
        self.decode_table: DecodeTable | None = None
        if chip.spec.family == "gpu":
            table = gemm_table(chip.spec.name, kernels)
            if table is not None and table.measures(precision):
                self.gemm_table = table
            attn = attention_table(chip.spec.name)
            if attn is not None and _attention_key(kv_dtype) in attn.precisions:
                self.attention_table = attn
            self.decode_table = decode_table(chip.spec.name)
            moe = moe_table(chip.spec.name)
            if (
                self.experts is not None
                and moe is not None
                and moe.lane(self.kernel_engine, precision, self.experts.key) is not None
            ):
                self.moe_table = moe
        # the chip's HBM time is linear in the bytes: one division per lookup
        self._hbm_s_per_byte = chip.op_time(Work(hbm_bytes=1.0)).engine_s[HBM]
        self._gemm_s = lru_cache(maxsize=65536)(self._gemms)
        self._experts_s = lru_cache(maxsize=65536)(self._experts_cost)
        self._decode_steps: dict[tuple[int, int, int | None], float] = {}
        self._lm_head_s = lru_cache(maxsize=65536)(self._lm_head)
        self._fixed_s = lru_cache(maxsize=65536)(self._fixed)
        self._attn_s = lru_cache(maxsize=262144)(self._attention)
        self._ar_s = lru_cache(maxsize=65536)(self._allreduce)
        self._dp_s = lru_cache(maxsize=65536)(self._dp_exchange)
        self._decode_attn_s = lru_cache(maxsize=262144)(self._decode_attention)

    @property
    def weight_bytes_per_rank(self) -> float:
        """The weights one rank holds (layers and LM head; embeddings are not read)."""
        s = self.shapes
        moe = 0.0
        if self.experts is not None:
            moe = self.moe_layers * (s.moe_weight_bytes + self.experts.bytes_per_rank)
        layers = self.dense_layers * s.weight_bytes + moe
        if self.pp == 1:
            return layers + 2 * s.lm_head_bytes
        # a stage of the most layers, and one of the embedding and the LM head
        return layers * self.stage_layers / self.model.layers + s.lm_head_bytes

    @property
    def kv_bytes_per_token_per_rank(self) -> float:
        return self.shapes.kv_token_bytes * self.stage_layers

    def _hbm_s(self, nbytes: float) -> float:
        return nbytes * self._hbm_s_per_byte

    def _gemms(self, rows: int, moe: bool = False) -> float:
        """The layer's GEMMs on ``rows`` tokens (a dense layer's four; a MoE layer's
        attention projections, router and shared experts): tensor time, no overhead (a
        measured GEMM's time, its weight reads and launch floor included, on GPUs)."""
        return self._gemm_list(rows, self.shapes.moe_gemms if moe else self.shapes.gemms)

    def _gemm_list(self, rows: int, gemms: Sequence[tuple[int, int]]) -> float:
        total = 0.0
        if self.gemm_table is not None:
            for k, n in gemms:
                total += self.gemm_table.time_s(rows, k, n, self.precision)
            return total
        for k, n in gemms:
            work = Work(matmul=(rows, k, n), precision=self.precision)
            total += self.chip.op_time(work).engine_s[0]
        return total

    def _experts_cost(self, rows: int) -> tuple[float, float]:
        """The routed experts of one MoE layer on ``rows`` tokens (:mod:`.moe`): the
        time of their kernels and, on Trainium, the weight bytes they read (which the
        layer's pipelined op streams beside its compute; 0 where the time includes
        them)."""
        e = self.experts
        if e is None:
            return 0.0, 0.0
        weights = e.active(rows) * e.expert_bytes
        if self.moe_table is not None:
            t = self.moe_table.time_s(self.kernel_engine, self.precision, e.key, rows)
            if t is not None:
                return t, 0.0
        if self.gemm_table is not None:
            gemm = self._gemm_list(e.pairs(rows), e.gemms)
            return max(gemm, weights * self._hbm_s_per_byte), 0.0
        # Each expert the batch touches streams its own weights through the array: its
        # share of the pairs as rows (what instruction-priced GEMMs need; a roofline
        # chip's FLOPs are the same as one GEMM of all the pairs).
        active = e.active(rows)
        per_expert = math.ceil(e.pairs(rows) / active) if active > 0 else 0
        gemm = active * self._gemm_list(per_expert, e.gemms) if per_expert else 0.0
        return gemm, weights

    def _attention(self, chunk: int, context: int) -> float:
        """QK^T and PV of a prompt chunk of ``chunk`` tokens over its causal context:
        the ``context`` tokens before it and, on average, half the chunk. The local
        heads are one fused kernel's problems, so they stack as rows of one matmul each
        (one latency floor for QK^T and one for PV, not one per head)."""
        s = self.shapes
        if self.attention_table is not None:
            # The measured causal forward over the whole span, less what the context
            # before the chunk would cost alone: the chunk's rows of the causal square.
            def causal(seq: int) -> float:
                if seq == 0 or self.attention_table is None:
                    return 0.0
                return self.attention_table.forward_s(
                    1, seq, s.heads, s.kv_heads, s.head_dim,
                    precision=_attention_key(self.kv_dtype),
                )  # fmt: skip

            return max(causal(context + chunk) - causal(context), 0.0)
        span = context + (chunk + 1) // 2
        rows = chunk * s.heads
        return self.chip.matmul_s(rows, s.head_dim, span, "bf16", count=2, kernel="attention")

    def _decode_attention(self, decodes: int, decode_context: int) -> float | None:
        """One layer's measured decode attention for ``decodes`` sequences holding
        ``decode_context`` cached tokens in all, each adding one; None where the
        engine's kernel was not measured for this layout."""
        if self.decode_table is None:
            return None
        s = self.shapes
        layout = (self.kernel_engine, self.kv_dtype, s.head_dim, s.heads, s.kv_heads)
        return self.decode_table.time_s(layout, decodes, (decode_context + decodes) / decodes)

    def _allreduce(self, rows: int) -> float:
        return (
            0.0 if self.tp == 1 else self.allreduce_s(float(rows * self.model.hidden * ACT_BYTES))
        )

    def _dp_exchange(self, rows: int) -> float:
        """One MoE layer's all-gather of every attention-DP group's ``rows`` tokens and
        the reduce-scatter of the experts' output (0 without attention DP)."""
        if self.attention_dp == 1:
            return 0.0
        return self.dp_gather_s(float(self.attention_dp * rows * self.model.hidden * ACT_BYTES))

    def _fixed(self, rows: int) -> float:
        """A layer's fixed costs on ``rows`` rows: op overheads and two all-reduces."""
        ops = GPU_SMALL_KERNELS if self.gemm_table is not None else OPS_PER_LAYER
        return ops * self.op_overhead_s + self.fixed_per_layer_s + 2 * self._ar_s(rows)

    def layer_s(
        self,
        chunks: Sequence[tuple[int, int]],
        decodes: int,
        decode_context: int,
        rows: int,
        moe: bool = False,
    ) -> float:
        """One layer: ``chunks`` (tokens, earlier context) of prefill, ``decodes``
        sequences reading ``decode_context`` cached tokens in all, ``rows`` GEMM rows;
        ``moe``: a MoE layer (its routed experts, :mod:`.moe`)."""
        s = self.shapes
        compute = self._gemm_s(rows, moe)
        expert_bytes = 0.0
        if moe:
            # Under attention data parallelism the experts take every group's tokens
            # (as many as this group's: the groups' batches taken as equal), gathered and
            # their outputs scattered back across the groups.
            t, expert_bytes = self._experts_s(rows * self.attention_dp)
            compute += t + self._dp_s(rows)
        kv_tokens = decode_context + decodes
        for c, ctx in chunks:
            compute += self._attn_s(c, ctx)
            kv_tokens += c + ctx
        kv = kv_tokens * s.kv_token_bytes
        if self.gemm_table is not None:
            # kernels one after another: measured GEMMs (weights read inside them),
            # attention reading the KV cache, the small kernels' launches; the decodes'
            # attention is its measured kernel where the layout was measured (its KV
            # reads and its launch inside it)
            measured = self._decode_attn_s(decodes, decode_context) if decodes else None
            if measured is not None:
                kv -= (decode_context + decodes) * s.kv_token_bytes
                compute += measured - self.op_overhead_s
            return compute + kv * self._hbm_s_per_byte + self._fixed_s(rows)
        weights = s.moe_weight_bytes + expert_bytes if moe else s.weight_bytes
        hbm = (weights + kv) * self._hbm_s_per_byte
        return (compute if compute > hbm else hbm) + self._fixed_s(rows)

    def lm_head_s(self, rows: int) -> float:
        """The LM head on ``rows`` sequences (cached per row count)."""
        return self._lm_head_s(rows)

    def _lm_head(self, rows: int) -> float:
        s = self.shapes
        k, n = s.lm_head
        if self.gemm_table is not None:
            return self.gemm_table.time_s(rows, k, n, self.precision) + self.op_overhead_s
        tensor = self.chip.op_time(Work(matmul=(rows, k, n), precision=self.precision)).engine_s[0]
        return max(tensor, self._hbm_s(s.lm_head_bytes)) + self.op_overhead_s

    def iteration_s(
        self,
        chunks: Sequence[tuple[int, int]] = (),
        decodes: int = 0,
        decode_context: int = 0,
        *,
        padded_decodes: int | None = None,
    ) -> float:
        """One iteration: every layer, then the LM head on the sequences that emit a
        token. ``padded_decodes`` (Neuron's fixed batch) sets the decode rows the
        GEMMs compute, whatever the number of live sequences. A decode-only iteration's
        time is kept by its shape (a padded batch repeats a few, step after step)."""
        if chunks:
            return self._iteration(chunks, decodes, decode_context, padded_decodes)
        key = (decodes, decode_context, padded_decodes)
        found = self._decode_steps.get(key)
        if found is None:
            if len(self._decode_steps) >= DECODE_SHAPES:
                self._decode_steps.clear()
            found = self._decode_steps[key] = self._iteration(
                (), decodes, decode_context, padded_decodes
            )
        return found

    def _iteration(
        self,
        chunks: Sequence[tuple[int, int]],
        decodes: int,
        decode_context: int,
        padded_decodes: int | None,
    ) -> float:
        rows_decode = decodes if padded_decodes is None else padded_decodes
        rows = rows_decode
        for c, _ctx in chunks:
            rows += c
        if rows == 0:
            return 0.0
        layers = 0.0
        if self.dense_layers:
            layers += self.dense_layers * self.layer_s(chunks, decodes, decode_context, rows)
        if self.moe_layers:
            layer = self.layer_s(chunks, decodes, decode_context, rows, moe=True)
            layers += self.moe_layers * layer
        if self.decode_attention is not None and rows_decode:
            # each sequence's keys: its cached context (a padded batch: the bucket) and
            # the token it adds
            keys = math.ceil(decode_context / (rows_decode if padded_decodes else decodes or 1))
            layers += self.model.layers * self.decode_attention(rows_decode, keys + 1)
        total = layers + self.lm_head_s(rows_decode + len(chunks)) + self.launch_s
        return total if self.stage_send_s is None else total + self.stage_send_s(rows)
