"""The ``serving:`` section: an inference-serving workload instead of ``training:``.

A serving scenario replaces ``training`` with ``serving`` (``clustersim serve``). Its
requests arrive as a Poisson process (``arrival.kind: poisson``, ``rate_per_s``) or
from a closed loop of ``concurrency`` clients that each send the next request when
the last one finished; each asks for ``input_tokens`` of prompt and ``output_tokens``
of generation (fixed, or lognormal per request). ``engine`` picks the scheduling
rules (:mod:`clustersim.serve.sched`):
``vllm`` (continuous batching with chunked prefill, paged KV, preemption by
recompute), ``trtllm`` (in-flight batching of the same shape, a prompt scheduled
whole: TensorRT-LLM's chunked context is off by default) or ``neuron`` (prefill and
decode never share a batch; shapes padded to compiled buckets).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from clustersim.catalog import register_model
from clustersim.catalog.schema import Strict

__all__ = [
    "ArrivalCfg",
    "DisaggregationCfg",
    "LognormalCfg",
    "ServingCfg",
    "SloCfg",
    "SpeculativeCfg",
    "longest",
    "serving_scenario",
]

Dtype = Literal["bf16", "fp16", "fp8", "int8"]


@register_model
class ArrivalCfg(Strict):
    """``poisson``: open-loop arrivals at ``rate_per_s``; ``closed``: ``concurrency``
    clients, each sending its next request as soon as the last one finished.

    ``ramp_s``: the clients' first requests go at times drawn uniformly from
    ``[0, ramp_s)``. Left out, a continuously batching engine's clients spread over
    the time one request takes at that concurrency, the desynchronised steady state
    a benchmark's clients reach (:func:`clustersim.serve.run.closed_loop_ramp_s`),
    and a static batch's all start at once; 0 starts every client at once."""

    kind: Literal["poisson", "closed"] = "poisson"
    rate_per_s: float | None = Field(default=None, gt=0, le=1e9, allow_inf_nan=False)
    concurrency: int | None = Field(default=None, ge=1, le=10_000_000)
    ramp_s: float | None = Field(default=None, ge=0, le=1e9, allow_inf_nan=False)

    @model_validator(mode="after")
    def _one_rule(self) -> ArrivalCfg:
        if self.kind == "poisson" and self.rate_per_s is None:
            raise ValueError("rate_per_s is required with kind: poisson")
        if self.kind == "closed" and self.concurrency is None:
            raise ValueError("concurrency is required with kind: closed")
        return self


@register_model
class LognormalCfg(Strict):
    """Lengths drawn per request from a lognormal of this ``median`` and ``sigma`` (of
    the length's logarithm), rounded and clipped to ``1..max``. The KV cache is sized
    for ``max`` (Neuron reserves it per slot)."""

    kind: Literal["lognormal"]
    median: int = Field(ge=1, le=100_000_000)
    sigma: float = Field(gt=0, le=10, allow_inf_nan=False)
    max: int = Field(ge=1, le=100_000_000)

    @model_validator(mode="after")
    def _max_above_median(self) -> LognormalCfg:
        if self.max < self.median:
            raise ValueError(f"max {self.max} is below the median {self.median}")
        return self


Length = Annotated[int, Field(ge=1, le=100_000_000)] | LognormalCfg


def longest(length: int | LognormalCfg) -> int:
    """The most tokens a length allows: the number, or the distribution's ``max``."""
    return length if isinstance(length, int) else length.max


def typical(length: int | LognormalCfg) -> int:
    """The number, or the distribution's median."""
    return length if isinstance(length, int) else length.median


@register_model
class SloCfg(Strict):
    """A request meets its SLO when its TTFT and its mean TPOT are within these (goodput)."""

    ttft_s: float = Field(default=2.0, gt=0, le=1e6, allow_inf_nan=False)
    tpot_s: float = Field(default=0.2, gt=0, le=1e6, allow_inf_nan=False)


@register_model
class DisaggregationCfg(Strict):
    """Prefill and decode on separate replicas: ``prefill_replicas`` only prefill,
    ``decode_replicas`` only decode, and each request's KV moves between them over the
    cluster's fabric (its time counts in TTFT)."""

    prefill_replicas: int = Field(ge=1, le=10_000_000)
    decode_replicas: int = Field(ge=1, le=10_000_000)


@register_model
class SpeculativeCfg(Strict):
    """Speculative decoding: a ``draft_model`` (a catalog model, on the same ranks)
    proposes ``tokens`` tokens a step, each accepted with probability ``acceptance``
    independently; the target verifies them in one pass and keeps the accepted prefix
    plus one token of its own."""

    draft_model: str = Field(min_length=1, max_length=200)
    tokens: int = Field(ge=1, le=64)
    acceptance: float = Field(ge=0, le=1, allow_inf_nan=False)


@register_model
class ServingCfg(Strict):
    """An inference-serving workload (``clustersim serve``).

    ``replicas`` of ``parallelism.tp`` ranks each (default: as many as the cluster
    holds) serve ``requests`` requests. ``precision`` is the matmuls' compute
    precision; ``weight_dtype`` and ``kv_dtype`` what the weights and the KV cache
    are stored in (int8 weights are read as one byte and computed at ``precision``).
    ``max_num_seqs`` is the most sequences a replica batches, ``max_num_batched_tokens``
    the token budget of one iteration (vLLM's names). ``hbm_utilization`` is the share
    of the replica's HBM the engine may fill with weights and KV (vLLM's
    ``gpu_memory_utilization``, default 0.9 in vLLM's engine arguments).
    """

    engine: Literal["vllm", "trtllm", "neuron"] = "vllm"
    batching: Literal["continuous", "static"] = "continuous"
    precision: Literal["bf16", "fp16", "fp8"] = "bf16"
    weight_dtype: Literal["bf16", "fp8", "int8"] = "bf16"
    kv_dtype: Dtype = "bf16"
    max_num_seqs: int = Field(default=256, ge=1, le=1_000_000)
    max_num_batched_tokens: int = Field(default=8192, ge=1, le=100_000_000)
    hbm_utilization: float = Field(default=0.9, gt=0, le=1, allow_inf_nan=False)
    arrival: ArrivalCfg
    requests: int = Field(default=1000, ge=1, le=10_000_000)
    # a number of tokens, or {kind: lognormal, median, sigma, max}
    input_tokens: Length = 1024
    output_tokens: Length = 128
    slo: SloCfg = Field(default_factory=SloCfg)
    replicas: int | None = Field(default=None, ge=1, le=10_000_000)
    dispatch: Literal["least_loaded", "round_robin"] = "least_loaded"
    disaggregation: DisaggregationCfg | None = None
    speculative: SpeculativeCfg | None = None

    @model_validator(mode="after")
    def _replicas_or_split(self) -> ServingCfg:
        if self.replicas is not None and self.disaggregation is not None:
            raise ValueError(
                "give replicas or disaggregation, not both: disaggregation counts its own"
            )
        return self


def serving_scenario(data: Any) -> Any:
    """Before validation: a scenario with ``serving`` has no ``training`` section.

    Refuses both together; otherwise fills ``training`` with placeholder values of 1
    (never read: ``clustersim serve`` builds no training step), so that the scenario
    model keeps one shape (as a trace workload's does, :mod:`.workload`).
    """
    if not isinstance(data, dict) or data.get("serving") is None:
        return data
    if "training" in data:
        raise ValueError("training and serving exclude each other: give one of them")
    return {**data, "training": {"seq_len": 1, "global_batch_size": 1}}
