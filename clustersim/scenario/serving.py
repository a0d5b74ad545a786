"""The ``serving:`` section: an inference-serving workload instead of ``training:``.

A serving scenario replaces ``training`` with ``serving`` (``clustersim serve``). Its
requests arrive as a Poisson process (``arrival.kind: poisson``, ``rate_per_s``), a
gamma renewal process of the same mean rate and coefficient of variation ``cv``
(``gamma``: bursty above 1, smoother below), from a closed loop of ``concurrency``
clients that each send the next request when the last one finished, or as a trace
replays them (``trace``: a CSV of ``timestamp, input_tokens, output_tokens``,
:mod:`clustersim.serve.arrivals`); each asks for ``input_tokens`` of prompt and
``output_tokens`` of generation (a number, or lognormal, uniform or fixed per
request; a trace's own). ``engine`` picks the scheduling
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
    "FixedCfg",
    "LognormalCfg",
    "PrefixCacheCfg",
    "ServingCfg",
    "SloCfg",
    "SpeculativeCfg",
    "UniformCfg",
    "longest",
    "serving_scenario",
]

Dtype = Literal["bf16", "fp16", "fp8", "int8"]


@register_model
class ArrivalCfg(Strict):
    """``poisson``: open-loop arrivals at ``rate_per_s``; ``gamma``: open-loop arrivals
    at ``rate_per_s`` whose gaps are gamma-distributed with coefficient of variation
    ``cv`` (1 is Poisson); ``closed``: ``concurrency`` clients, each sending its next
    request as soon as the last one finished; ``trace``: the requests of ``file`` (a
    CSV of ``timestamp, input_tokens, output_tokens``) at their times.

    ``ramp_s``: the clients' first requests go at times drawn uniformly from
    ``[0, ramp_s)``. Left out, a continuously batching engine's clients spread over
    the time one request takes at that concurrency, the desynchronised steady state
    a benchmark's clients reach (:func:`clustersim.serve.run.closed_loop_ramp_s`),
    and a static batch's all start at once; 0 starts every client at once."""

    kind: Literal["poisson", "gamma", "closed", "trace"] = "poisson"
    """`poisson` (open loop at `rate_per_s`), `gamma` (open loop at `rate_per_s`, gaps of
    coefficient of variation `cv`), `closed` (`concurrency` clients) or `trace` (a CSV)."""
    rate_per_s: float | None = Field(default=None, gt=0, le=1e9, allow_inf_nan=False)
    """Mean requests per second; required with `poisson` and `gamma`."""
    cv: float | None = Field(default=None, gt=0, le=100, allow_inf_nan=False)
    """Coefficient of variation of the gaps between arrivals; required with `gamma`."""
    file: str | None = Field(default=None, min_length=1, max_length=4096)
    """The trace: a CSV with columns `timestamp` (seconds, or ISO 8601 date-times),
    `input_tokens` and `output_tokens`; a relative path is beside the scenario file.
    Required with `trace`."""
    concurrency: int | None = Field(default=None, ge=1, le=10_000_000)
    """Clients, each sending its next request once its last one finished; required with `closed`."""
    ramp_s: float | None = Field(default=None, ge=0, le=1e9, allow_inf_nan=False)
    """Seconds over which a closed loop's clients start, at seeded random times; default: one
    request's time at that concurrency (a static batch: 0, all at once)."""

    @model_validator(mode="after")
    def _one_rule(self) -> ArrivalCfg:
        if self.kind in ("poisson", "gamma") and self.rate_per_s is None:
            raise ValueError(f"rate_per_s is required with kind: {self.kind}")
        if self.kind == "gamma" and self.cv is None:
            raise ValueError("cv is required with kind: gamma")
        if self.kind == "closed" and self.concurrency is None:
            raise ValueError("concurrency is required with kind: closed")
        if self.kind == "trace" and self.file is None:
            raise ValueError("file is required with kind: trace")
        return self


@register_model
class LognormalCfg(Strict):
    """Lengths drawn per request from a lognormal of this ``median`` and ``sigma`` (of
    the length's logarithm), rounded and clipped to ``1..max``. The KV cache is sized
    for ``max`` (Neuron reserves it per slot)."""

    kind: Literal["lognormal"]
    """`lognormal`."""
    median: int = Field(ge=1, le=100_000_000)
    """Median length (tokens)."""
    sigma: float = Field(gt=0, le=10, allow_inf_nan=False)
    """Standard deviation of the length's logarithm."""
    max: int = Field(ge=1, le=100_000_000)
    """Longest length (tokens): draws are clipped to 1..max, and the KV cache is sized for it."""

    @model_validator(mode="after")
    def _max_above_median(self) -> LognormalCfg:
        if self.max < self.median:
            raise ValueError(f"max {self.max} is below the median {self.median}")
        return self


@register_model
class UniformCfg(Strict):
    """Lengths drawn per request uniformly from the integers ``min..max``."""

    kind: Literal["uniform"]
    """`uniform`."""
    min: int = Field(ge=1, le=100_000_000)
    """Shortest length (tokens)."""
    max: int = Field(ge=1, le=100_000_000)
    """Longest length (tokens)."""

    @model_validator(mode="after")
    def _ordered(self) -> UniformCfg:
        if self.max < self.min:
            raise ValueError(f"max {self.max} is below min {self.min}")
        return self


@register_model
class FixedCfg(Strict):
    """Every request the same length (the same as giving the number)."""

    kind: Literal["fixed"]
    """`fixed`."""
    tokens: int = Field(ge=1, le=100_000_000)
    """The length (tokens)."""


Distribution = Annotated[LognormalCfg | UniformCfg | FixedCfg, Field(discriminator="kind")]
Length = Annotated[int, Field(ge=1, le=100_000_000)] | Distribution
LengthValue = int | LognormalCfg | UniformCfg | FixedCfg


def longest(length: LengthValue) -> int:
    """The most tokens a length allows: the number, or the distribution's largest."""
    if isinstance(length, int):
        return length
    return length.tokens if isinstance(length, FixedCfg) else length.max


def typical(length: LengthValue) -> int:
    """The number, or the distribution's median."""
    if isinstance(length, int):
        return length
    if isinstance(length, UniformCfg):
        return (length.min + length.max) // 2
    return length.tokens if isinstance(length, FixedCfg) else length.median


@register_model
class PrefixCacheCfg(Strict):
    """Automatic prefix caching: ``hit_rate`` of every prompt's tokens, in whole KV
    blocks, are found in the cache and not prefilled again."""

    hit_rate: float = Field(default=0.0, ge=0, le=1, allow_inf_nan=False)
    """Share of each prompt's tokens found in the cache (0: none)."""


@register_model
class SloCfg(Strict):
    """A request meets its SLO when its TTFT and its mean TPOT are within these (goodput)."""

    ttft_s: float = Field(default=2.0, gt=0, le=1e6, allow_inf_nan=False)
    """Time-to-first-token target (s)."""
    tpot_s: float = Field(default=0.2, gt=0, le=1e6, allow_inf_nan=False)
    """Target of the mean time per output token (s)."""


@register_model
class DisaggregationCfg(Strict):
    """Prefill and decode on separate replicas: ``prefill_replicas`` only prefill,
    ``decode_replicas`` only decode, and each request's KV moves between them over the
    cluster's fabric (its time counts in TTFT)."""

    prefill_replicas: int = Field(ge=1, le=10_000_000)
    """Replicas that only prefill."""
    decode_replicas: int = Field(ge=1, le=10_000_000)
    """Replicas that only decode."""


@register_model
class SpeculativeCfg(Strict):
    """Speculative decoding: a ``draft_model`` (a catalog model, on the same ranks)
    proposes ``tokens`` tokens a step, each accepted with probability ``acceptance``
    independently; the target verifies them in one pass and keeps the accepted prefix
    plus one token of its own."""

    draft_model: str = Field(min_length=1, max_length=200)
    """The catalog model that drafts tokens, on the same ranks."""
    tokens: int = Field(ge=1, le=64)
    """Tokens drafted per step."""
    acceptance: float = Field(ge=0, le=1, allow_inf_nan=False)
    """Probability that a drafted token is accepted, each independently."""


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
    """Scheduling rules: `vllm` (continuous batching, chunked prefill), `trtllm` (whole prompts,
    no preemption) or `neuron` (prefill and decode in separate batches, compiled buckets)."""
    batching: Literal["continuous", "static"] = "continuous"
    """`continuous` (requests join and leave each iteration) or `static` (a batch is prefilled
    together and decoded until all its requests finish)."""
    precision: Literal["bf16", "fp16", "fp8"] = "bf16"
    """Compute precision of the matmuls."""
    weight_dtype: Literal["bf16", "fp8", "int8"] = "bf16"
    """What the weights are stored in (int8 is read as one byte and computed at `precision`)."""
    kv_dtype: Dtype = "bf16"
    """What the KV cache is stored in."""
    max_num_seqs: int = Field(default=256, ge=1, le=1_000_000)
    """Most sequences a replica batches (vLLM's name)."""
    max_num_batched_tokens: int = Field(default=8192, ge=1, le=100_000_000)
    """Token budget of one iteration (vLLM's name)."""
    hbm_utilization: float = Field(default=0.9, gt=0, le=1, allow_inf_nan=False)
    """Share of a replica's HBM the engine may fill with weights and KV (vLLM's
    `gpu_memory_utilization`)."""
    arrival: ArrivalCfg
    """How requests arrive."""
    requests: int = Field(default=1000, ge=1, le=10_000_000)
    """Requests simulated."""
    # a number of tokens, or {kind: lognormal | uniform | fixed, ...}
    input_tokens: Length = 1024
    """Prompt tokens per request: a number, or a lognormal, uniform or fixed distribution
    (a trace's own with `arrival.kind: trace`)."""
    output_tokens: Length = 128
    """Generated tokens per request: a number, or a lognormal, uniform or fixed distribution
    (a trace's own with `arrival.kind: trace`)."""
    prefix_cache: PrefixCacheCfg = Field(default_factory=PrefixCacheCfg)
    """Automatic prefix caching: the share of each prompt found in the cache."""
    slo: SloCfg = Field(default_factory=SloCfg)
    """The latency targets that goodput counts against."""
    replicas: int | None = Field(default=None, ge=1, le=10_000_000)
    """Replicas of `parallelism.tp` ranks each; default: as many as the cluster holds."""
    dispatch: Literal["least_loaded", "round_robin"] = "least_loaded"
    """How the router picks a replica for a request: `least_loaded` or `round_robin`."""
    disaggregation: DisaggregationCfg | None = None
    """Separate prefill and decode replicas, with each request's KV moved over the fabric (in
    place of `replicas`)."""
    speculative: SpeculativeCfg | None = None
    """Speculative decoding with a draft model."""
    attention_dp: int = Field(default=1, ge=1, le=1024)
    """Attention data-parallel groups per replica (mixture-of-experts models, `vllm` and
    `trtllm` on GPUs): a replica is `attention_dp` groups of `parallelism.tp` ranks, each
    group running attention on its own batch with its own scheduler and KV cache, and the
    MoE layers run expert-parallel over all the replica's ranks (`parallelism.ep` of
    them dividing `attention_dp x tp`), each all-gathering every group's tokens and
    reduce-scattering the experts' output."""

    @model_validator(mode="after")
    def _replicas_or_split(self) -> ServingCfg:
        if self.replicas is not None and self.disaggregation is not None:
            raise ValueError(
                "give replicas or disaggregation, not both: disaggregation counts its own"
            )
        if self.arrival.kind == "trace":
            given = {"input_tokens", "output_tokens"} & self.model_fields_set
            if given:
                raise ValueError(
                    f"{min(given)} comes from the trace (arrival.kind: trace); leave it out"
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
