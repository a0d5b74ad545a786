"""The layouts a serving capacity search tries, and their closed-form estimates.

A *layout* is an instance type, a tensor-parallel size within one instance and the
engine's batch. :func:`layouts_of` lists them for the given instance types;
:func:`scenario_of` writes the search's scenario onto a layout and an instance count;
:func:`estimate` times a layout in closed form from its iteration model, or says why
it cannot serve (:mod:`clustersim.serve.capacity` uses both).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clustersim import catalog, cost
from clustersim.errors import ScenarioError
from clustersim.scenario import Resolved, resolve
from clustersim.scenario.serving import typical
from clustersim.serve.iteration import IterationModel
from clustersim.serve.run import draft_model, iteration_model, kv_capacity, serving_of
from clustersim.serve.sched import BLOCK_TOKENS

__all__ = [
    "DEFAULT_INSTANCES",
    "NEURON_BATCHES",
    "START_FRACTION",
    "Estimate",
    "Layout",
    "estimate",
    "layouts_of",
    "scenario_of",
]

DEFAULT_INSTANCES: tuple[str, ...] = (
    "trn2.48xlarge",
    "trn1.32xlarge",
    "inf2.48xlarge",
    "inf2.24xlarge",
    "inf2.8xlarge",
    "inf2.xlarge",
    "p5.48xlarge",
    "p5en.48xlarge",
)
"""Trainium 2 and 1, every Inferentia2 size, H100 and H200 (p5en: the catalog has no
p5e, whose 8 H200s p5en also holds)."""
NEURON_BATCHES: tuple[int, ...] = (8, 16, 32, 64)
"""Compiled decode batches tried on Neuron (and the scenario's own, if Neuron)."""
GPU_MAX_NUM_SEQS = 256
GPU_MAX_BATCHED_TOKENS = 8192
"""vLLM's engine defaults, for a GPU layout of a scenario written for Neuron."""
START_FRACTION = 0.5
"""The estimated fewest instances is scaled by this before simulating from it: the
closed form leaves out queueing but also chunked prefill sharing a decode's weight
reads, so it can err either way."""


@dataclass(frozen=True)
class Layout:
    instance: str
    tp: int
    engine: str
    max_num_seqs: int
    max_num_batched_tokens: int

    @property
    def label(self) -> str:
        return f"{self.instance} tp{self.tp} b{self.max_num_seqs}"


@dataclass(frozen=True)
class Estimate:
    replicas_per_instance: int
    chips_per_instance: int
    tpot_floor_s: float
    ttft_floor_s: float
    capacity_rps: float  # one replica's requests per second, by the closed form
    start_count: int
    usd_per_instance_hour: float


def scenario_of(
    res: Resolved, lay: Layout, count: int, rate: float, requests: int
) -> dict[str, Any]:
    """The scenario on ``count`` instances of ``lay``: aggregated serving (no
    disaggregation, no failures), Poisson at ``rate``, ``requests`` requests."""
    raw = copy.deepcopy(res.raw)
    pricing = (raw.get("cluster") or {}).get("prices_usd_per_hour")
    raw["cluster"] = {"instance": lay.instance, "count": count}
    if pricing and res.instance.name == lay.instance:
        raw["cluster"]["prices_usd_per_hour"] = pricing
    raw["parallelism"] = {"tp": lay.tp}
    raw.pop("failures", None)
    raw["output"] = {"trace": False, "html": False}
    serving = dict(raw["serving"])
    for key in ("replicas", "disaggregation"):
        serving.pop(key, None)
    serving.update(
        engine=lay.engine,
        max_num_seqs=lay.max_num_seqs,
        max_num_batched_tokens=lay.max_num_batched_tokens,
        arrival={"kind": "poisson", "rate_per_s": rate},
        requests=requests,
    )
    raw["serving"] = serving
    return raw


def layouts_of(res: Resolved, instances: Sequence[str]) -> list[Layout]:
    cfg = serving_of(res)
    out = []
    for name in instances:
        inst = catalog.instance(name, None, "--instance")
        chip = catalog.chip(inst.chip)
        ranks = inst.chips * chip.cores // chip.lnc_default
        if chip.vendor == "aws":  # Trainium and Inferentia run Neuron's rules
            batches = sorted({*NEURON_BATCHES, *([cfg.max_num_seqs] * (cfg.engine == "neuron"))})
            engine, tokens = "neuron", cfg.max_num_batched_tokens
        else:
            gpu_engine = cfg.engine != "neuron"
            batches = [cfg.max_num_seqs if gpu_engine else GPU_MAX_NUM_SEQS]
            engine = cfg.engine if gpu_engine else "vllm"
            tokens = cfg.max_num_batched_tokens if gpu_engine else GPU_MAX_BATCHED_TOKENS
        for tp in (d for d in range(1, ranks + 1) if ranks % d == 0):
            out += [Layout(inst.name, tp, engine, b, tokens) for b in batches]
    return out


def _prefill_s(model: IterationModel, lay: Layout, prompt: int) -> float:
    """One prompt prefilled alone: in segments of the token budget, or whole (trtllm)."""
    if lay.engine == "trtllm":
        return model.iteration_s(((prompt, 0),))
    total, done = 0.0, 0
    while done < prompt:
        chunk = min(lay.max_num_batched_tokens, prompt - done)
        total += model.iteration_s(((chunk, done),))
        done += chunk
    return total


def estimate(res: Resolved, lay: Layout, rate: float, requests: int) -> tuple[Estimate | None, str]:
    """The closed-form estimate of a layout on one instance, or why it cannot serve."""
    try:
        one = resolve(scenario_of(res, lay, 1, rate, requests))
        cfg = serving_of(one)
        model = iteration_model(one, cfg)
        blocks = kv_capacity(one, model, cfg, draft_model(one, cfg, model))
        usd = cost.usd_per_hour(one.instance, 1, one.scenario.cost, one.chip)
    except ScenarioError as exc:
        return None, f"{exc.path}: {exc.problem}"
    slo = cfg.slo
    prompt, out = typical(cfg.input_tokens), typical(cfg.output_tokens)
    padded = lay.max_num_seqs if lay.engine == "neuron" else None

    def step(batch: int) -> float:
        return model.iteration_s((), batch, batch * (prompt + out // 2), padded_decodes=padded)

    tpot = model.iteration_s((), 1, prompt, padded_decodes=padded)
    ttft = _prefill_s(model, lay, prompt)
    if tpot > slo.tpot_s:
        why = f"batch-1 decode step {tpot * 1e3:.1f} ms > TPOT target {slo.tpot_s * 1e3:g} ms"
        return None, why
    if ttft > slo.ttft_s:
        why = f"one prompt's prefill {ttft * 1e3:.0f} ms > TTFT target {slo.ttft_s * 1e3:g} ms"
        return None, why
    largest = max(1, min(lay.max_num_seqs, blocks * BLOCK_TOKENS // (prompt + out)))
    lo, hi = 1, largest  # the largest batch whose step meets the TPOT target
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if step(mid) <= slo.tpot_s else (lo, mid - 1)
    capacity = 1.0 / (ttft + out * step(lo) / lo)
    reps = one.ranks // lay.tp
    start = max(1, math.ceil(START_FRACTION * rate / (capacity * reps)))
    est = Estimate(reps, one.chips, tpot, ttft, capacity, start, usd)
    return est, ""
