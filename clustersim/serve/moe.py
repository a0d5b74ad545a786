"""A mixture-of-experts layer's routed experts on one rank of a serving replica.

The replica's ``tp`` ranks hold the experts as ``ep`` groups of whole experts, each
expert's width split ``moe_tp = tp / ep`` ways: ``ep = 1`` shards every expert across
the ranks (vLLM's and TensorRT-LLM's default), ``ep = tp`` gives each rank whole
experts (vLLM's ``--enable-expert-parallel``, TensorRT-LLM's
``moe_expert_parallel_size``). Attention stays tensor-parallel, so every rank sees
every token of the batch, computes its own experts' share and the layer's
all-reduce sums the shares: the same two all-reduces a layer as a dense model (vLLM
``FusedMoE`` with ``reduce_results``; TensorRT-LLM's MoE with attention TP). With
``serving.attention_dp`` the experts spread over every group's ranks and take every
group's tokens (:class:`~clustersim.serve.iteration.IterationModel`); all-to-all
dispatch is not modelled.

Time of the experts on ``T`` tokens:

- on a GPU whose measured MoE table holds the shape
  (:mod:`clustersim.hardware.moe_kernels`), the engine's measured fused MoE kernel;
- otherwise the experts' grouped GEMMs: on a GPU one measured GEMM of the rank's
  expected token-expert pairs (``T x top_k / ep`` rows); on Trainium each expert the
  batch touches runs its own GEMMs on its share of the pairs (its weights stream
  through the array: the tiled kernels' instructions); and the weights of the experts
  the batch activates, read once each. With
  ``top_k`` experts drawn per token out of ``experts``, an expert is idle with
  probability ``(1 - top_k / experts) ** T``, so a rank reads on average
  ``experts / ep x (1 - (1 - top_k / experts) ** T)`` experts' weights (uniform
  routing: a lower bound; skew puts more tokens on fewer experts but the same
  number of experts is touched at decode's batch sizes).
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.catalog.schema import ModelSpec
from clustersim.errors import ScenarioError
from clustersim.scenario import Resolved
from clustersim.scenario.serving import ServingCfg

__all__ = ["Experts", "attention_dp_problem", "experts_of"]


@dataclass(frozen=True)
class Experts:
    """One rank's routed experts in one MoE layer."""

    experts: int
    top_k: int
    ffn: int
    hidden: int
    ep: int
    moe_tp: int
    weight_bytes: int  # bytes per weight element

    @property
    def local(self) -> int:
        return self.experts // self.ep

    @property
    def key(self) -> tuple[int, int, int, int, int, int]:
        """The measured MoE table's key (:data:`~clustersim.hardware.moe_kernels.MoeKey`)."""
        return (self.hidden, self.ffn, self.top_k, self.experts, self.moe_tp, self.ep)

    @property
    def gemms(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """One expert's (k, n) on this rank: gate and up fused, then down."""
        width = self.ffn // self.moe_tp
        return ((self.hidden, 2 * width), (width, self.hidden))

    @property
    def expert_bytes(self) -> float:
        """One expert's weights on this rank."""
        return float(sum(k * n for k, n in self.gemms) * self.weight_bytes)

    @property
    def bytes_per_rank(self) -> float:
        """Every local expert's weights (what the rank holds)."""
        return self.local * self.expert_bytes

    def active(self, tokens: int) -> float:
        """Expected local experts at least one of ``tokens`` tokens is routed to."""
        return self.local * (1.0 - (1.0 - self.top_k / self.experts) ** tokens)

    def pairs(self, tokens: int) -> int:
        """Expected token-expert pairs on this rank, rounded up: the GEMMs' rows."""
        return -(-tokens * self.top_k // self.ep)


def experts_of(model: ModelSpec, tp: int, ep: int, weight_bytes: int) -> Experts | None:
    """The routed experts one rank of a ``tp``-rank replica holds (None for a dense
    model); exit 2 on a layout the model cannot take."""
    moe = model.moe
    if moe is None:
        if ep != 1:
            raise ScenarioError("parallelism.ep", ep, f"{model.name} has no experts")
        return None
    if tp % ep:
        raise ScenarioError("parallelism.ep", ep, f"must divide tp {tp} (a replica's ranks)")
    if moe.experts % ep:
        raise ScenarioError("parallelism.ep", ep, f"must divide the model's {moe.experts} experts")
    moe_tp = tp // ep
    if moe.expert_ffn_hidden % moe_tp:
        raise ScenarioError(
            "parallelism.ep",
            ep,
            f"tp / ep = {moe_tp} must divide the experts' width {moe.expert_ffn_hidden}",
        )
    return Experts(
        experts=moe.experts,
        top_k=moe.top_k,
        ffn=moe.expert_ffn_hidden,
        hidden=model.hidden,
        ep=ep,
        moe_tp=moe_tp,
        weight_bytes=weight_bytes,
    )


def attention_dp_problem(res: Resolved, cfg: ServingCfg) -> None:
    """Exit 2 where attention data parallelism is not modelled (``serving.attention_dp``)."""
    why = ""
    if res.model.moe is None:
        why = f"{res.model.name} has no experts: groups of a dense model are replicas"
    elif cfg.engine == "neuron" or res.chip.family != "gpu":
        why = "modelled for the vllm and trtllm engines on GPUs"
    elif res.scenario.parallelism.pp > 1:
        why = "not modelled with pipeline parallelism"
    elif cfg.disaggregation is not None or cfg.speculative is not None:
        why = "not modelled with disaggregation or speculative decoding"
    elif res.scenario.failures.inject:
        why = "not modelled with failure injection"
    if why:
        raise ScenarioError("serving.attention_dp", cfg.attention_dp, why)
