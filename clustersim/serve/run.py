"""From a resolved serving scenario to its requests and summary.

``serve(res)`` checks the scenario (exit 2 naming the key), sizes the replicas'
KV cache from what their HBM holds beside the weights, builds one
:class:`~clustersim.serve.iteration.IterationModel` (every replica is placed alike,
so all share it), simulates the requests (:class:`~clustersim.serve.sched.ServeSim`)
and summarises them: TTFT, TPOT and end-to-end latency percentiles, throughput,
goodput under the SLO, and cost per million tokens at the cluster's price. With
``failures.inject`` the replicas fail or slow down during the run
(:mod:`clustersim.serve.faults`) and the summary gains ``failures``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import simpy

from clustersim import catalog, cost
from clustersim.errors import MISSING, ScenarioError
from clustersim.hardware.chip import ChipModel
from clustersim.scenario import Resolved
from clustersim.scenario.serving import ServingCfg, longest, typical
from clustersim.serve.arrivals import workload
from clustersim.serve.bands import uncertainty
from clustersim.serve.collectives import DpGather, TpAllReduce
from clustersim.serve.disagg import FabricKvTransfer, check_disaggregation
from clustersim.serve.faults import ServeFaults, failure_summary, serving_faults
from clustersim.serve.iteration import IterationModel
from clustersim.serve.moe import attention_dp_problem
from clustersim.serve.pipeline import StageSends, pipeline_problem, virtual_engines
from clustersim.serve.requests import request_frame
from clustersim.serve.sched import BLOCK_TOKENS, LOG_FIELDS, IterationCost
from clustersim.serve.sim import ServeSim
from clustersim.serve.speculative import SpeculativeCost, expected_tokens_per_step
from clustersim.units import format_bytes

__all__ = [
    "ServeResult",
    "budget_warning",
    "check_serving",
    "kv_capacity",
    "serve",
    "serving_of",
]

GIB = 2.0**30


@dataclass(frozen=True)
class ServeResult:
    summary: dict[str, Any]
    requests: pd.DataFrame
    iterations: pd.DataFrame | None = None
    """With ``serve(record=True)``: one row per iteration (or run of decode iterations
    in one timeout) of every replica (:func:`iteration_frame`)."""


def serving_of(res: Resolved) -> ServingCfg:
    """The scenario's ``serving`` section; exit 2 when it has none."""
    cfg = res.scenario.serving
    if cfg is None:
        raise ScenarioError("serving", MISSING, "clustersim serve needs a serving section")
    return cfg


def kv_capacity(
    res: Resolved,
    model: IterationModel,
    cfg: ServingCfg,
    draft: IterationModel | None = None,
    seq: int | None = None,
) -> int:
    """KV blocks of ``BLOCK_TOKENS`` one replica's cache holds, checked against HBM.

    vLLM: what ``hbm_utilization`` of a rank's HBM leaves beside its weights. Neuron:
    the compiled ``max_num_seqs`` slots of the longest ``input_tokens + output_tokens`` each,
    which must fit the same room. Either way one whole request must fit, or exit 2
    naming the sizes. A speculative ``draft`` shares the ranks: its weights sit beside
    the target's, and each cached token holds both models' KV. ``seq``: the longest
    request's tokens (default: the longest lengths ``cfg`` allows; a trace's own).
    """
    hbm = res.chip.hbm_bytes / res.ranks_per_chip * cfg.hbm_utilization
    weights = model.weight_bytes_per_rank
    per_token = model.kv_bytes_per_token_per_rank
    if draft is not None:
        weights += draft.weight_bytes_per_rank
        per_token += draft.kv_bytes_per_token_per_rank
    if seq is None:
        seq = longest(cfg.input_tokens) + longest(cfg.output_tokens)
    seq_blocks = math.ceil(seq / BLOCK_TOKENS)
    need = seq_blocks * BLOCK_TOKENS * per_token
    if weights + need > hbm:
        raise ScenarioError(
            "model",
            res.model.name,
            f"does not fit a rank at tp {model.tp}: weights {format_bytes(weights)} + KV of one "
            f"{seq}-token request {format_bytes(need)} > {format_bytes(hbm)} "
            f"({cfg.hbm_utilization:g} of {format_bytes(hbm / cfg.hbm_utilization)} per rank)",
        )
    room = int((hbm - weights) // (BLOCK_TOKENS * per_token))
    if cfg.engine != "neuron":
        return room
    static = cfg.max_num_seqs * seq_blocks
    if static > room:
        raise ScenarioError(
            "serving.max_num_seqs",
            cfg.max_num_seqs,
            f"Neuron reserves KV for every slot: {cfg.max_num_seqs} x {seq} tokens = "
            f"{format_bytes(static * BLOCK_TOKENS * per_token)} per rank > the "
            f"{format_bytes(hbm - weights)} left beside the weights",
        )
    return static


def replicas_of(res: Resolved, cfg: ServingCfg) -> int:
    """Replicas of ``tp x pp`` ranks the run has (exit 2 when they do not fit)."""
    tp = res.scenario.parallelism.tp * res.scenario.parallelism.pp * cfg.attention_dp
    fit = res.ranks // tp
    if fit < 1:
        if cfg.attention_dp > 1:
            raise ScenarioError(
                "serving.attention_dp",
                cfg.attention_dp,
                f"{cfg.attention_dp} groups of tp {res.scenario.parallelism.tp} need {tp} "
                f"ranks, more than the cluster's {res.ranks}",
            )
        raise ScenarioError("parallelism.tp", tp, f"more than the cluster's {res.ranks} ranks")
    if cfg.disaggregation is not None:
        return check_disaggregation(cfg.disaggregation, fit, tp)
    if cfg.replicas is None:
        return fit
    if cfg.replicas > fit:
        raise ScenarioError(
            "serving.replicas",
            cfg.replicas,
            f"only {fit} replicas of tp {tp} fit {res.ranks} ranks",
        )
    return cfg.replicas


def iteration_model(
    res: Resolved,
    cfg: ServingCfg,
    *,
    overheads: bool = True,
    allreduce: Callable[[float], float] | None = None,
) -> IterationModel:
    """The replicas' iteration model; ``overheads=False`` times the TP all-reduces at
    their wire time alone (:class:`~clustersim.serve.collectives.TpAllReduce`), and
    ``allreduce`` replaces their model (a replica with a lost lane)."""
    tp, pp = res.scenario.parallelism.tp, res.scenario.parallelism.pp
    if res.scenario.parallelism.cp != 1:
        raise ScenarioError(
            "parallelism.cp", res.scenario.parallelism.cp, "serving has no context parallelism"
        )
    if pp > 1:
        pipeline_problem(res, cfg, pp)
    if cfg.precision == "fp8" and res.chip.core.tensor_tflops.fp8 is None:
        raise ScenarioError("serving.precision", "fp8", f"{res.chip.name} has no FP8 tensor rate")
    adp = cfg.attention_dp
    if adp > 1:
        attention_dp_problem(res, cfg)
    healthy = TpAllReduce(res, tp, overheads=overheads, engine=cfg.engine)
    return IterationModel(
        res.model, ChipModel(res.chip, res.lnc), tp, precision=cfg.precision,
        weight_dtype=cfg.weight_dtype, kv_dtype=cfg.kv_dtype,
        allreduce_s=healthy if allreduce is None else allreduce, launch_s=healthy.launch_s,
        kernels="vllm" if cfg.engine == "vllm" else None, ep=res.scenario.parallelism.ep,
        pp=pp, stage_send_s=StageSends(res, tp, pp) if pp > 1 else None,
        attention_dp=adp, dp_gather_s=DpGather(res, tp, adp) if adp > 1 else lambda _n: 0.0,
    )  # fmt: skip


def draft_model(res: Resolved, cfg: ServingCfg, target: IterationModel) -> IterationModel | None:
    """The speculative draft's iteration model on the target's ranks (None without
    ``serving.speculative``): its all-reduces the target's collective model, no launch
    of its own (the draft runs inside the target's program, as fused speculation does)."""
    spec = cfg.speculative
    if spec is None:
        return None
    model = catalog.model(spec.draft_model, path="serving.speculative.draft_model")
    if model.moe is not None or model.mla is not None:
        raise ScenarioError(
            "serving.speculative.draft_model", spec.draft_model, "a draft must be a dense model"
        )
    if model.kv_heads % target.tp and target.tp % model.kv_heads:
        raise ScenarioError(
            "serving.speculative.draft_model",
            spec.draft_model,
            f"its {model.kv_heads} KV heads do not divide into tp {target.tp} nor it into them",
        )
    return IterationModel(
        model, target.chip, target.tp, precision=cfg.precision,
        weight_dtype=cfg.weight_dtype, kv_dtype=cfg.kv_dtype, allreduce_s=target.allreduce_s,
        kernels=target.kernels,
    )  # fmt: skip


def check_serving(res: Resolved) -> str:
    """Every check ``serve`` makes before simulating (exit 2 naming the key); one line
    saying what would run (``clustersim check`` of a serving scenario)."""
    cfg = serving_of(res)
    model = iteration_model(res, cfg)
    wl = workload(cfg, res.scenario.seed)
    seq = wl.longest_input + wl.longest_output
    blocks = kv_capacity(res, model, cfg, draft_model(res, cfg, model), seq)
    n_rep = replicas_of(res, cfg)
    _faults(res, cfg, model, n_rep)
    groups = f" in {model.attention_dp} attention-DP groups" if model.attention_dp > 1 else ""
    return (
        f"{res.scenario.name}: {n_rep} replicas of tp {model.tp}"
        f"{f' x pp {model.pp}' if model.pp > 1 else ''}{groups} x {res.chip.name} "
        f"({cfg.engine}), weights {format_bytes(model.weight_bytes_per_rank)} and KV for "
        f"{blocks * BLOCK_TOKENS:,} tokens per rank; batch-1 decode "
        f"{model.iteration_s((), 1, typical(cfg.input_tokens)) * 1e3:.2f} ms"
    )


def budget_warning(cfg: ServingCfg, prompt: int | None = None) -> str | None:
    """A line saying that TensorRT-LLM's token budget leaves no room for the longest
    prompt beside a full batch's decodes, or None. With chunked context off (its
    default) a waiting prompt joins an iteration only whole (:mod:`.sched`), so such a
    prompt waits for the running batch to drain: prompts run one batch at a time,
    which is what the engine does with that budget, but rarely what a user meant.
    ``prompt``: the longest prompt (default: the longest ``cfg`` allows)."""
    if cfg.engine != "trtllm" or cfg.batching != "continuous" or cfg.max_num_seqs < 2:
        return None
    if prompt is None:
        trace = cfg.arrival.kind == "trace"
        prompt = workload(cfg, 0).longest_input if trace else longest(cfg.input_tokens)
    need = prompt + cfg.max_num_seqs - 1
    if need <= cfg.max_num_batched_tokens:
        return None
    return (
        f"serving.max_num_batched_tokens: {cfg.max_num_batched_tokens} leaves no room for a "
        f"prompt of {prompt:,} tokens beside {cfg.max_num_seqs - 1} decodes; TensorRT-LLM "
        f"schedules a prompt whole, so it waits until the running batch drains (set it to "
        f"at least {need:,} to admit prompts into a running batch)"
    )


def closed_loop_ramp_s(
    cfg: ServingCfg, cost: IterationCost, replicas: int, input_tokens: float, output_tokens: float
) -> float:
    """How long the clients of a closed loop take to start, left to the default: the
    time one request takes with every client's request in flight (its prompt alone,
    then its output tokens decoding in a batch of the clients one replica holds).

    Benchmark clients sent together stay together only in an ideal system: any jitter
    in when a client's next request reaches the engine (its HTTP round trip, the
    tokenizer) puts it a scheduling step apart from the rest, and a continuously
    batching engine keeps them apart, each prompt prefilled as it comes. So the steady
    state a benchmark measures is the clients' requests spread over one request's
    time, which starting them at random over that time reproduces. A static batch is
    formed from requests sent together (the Neuron benchmark tables), so it starts at
    once; so does an explicit ``arrival.ramp_s``.
    """
    arrival = cfg.arrival
    if arrival.kind != "closed":
        return 0.0
    if arrival.ramp_s is not None:
        return arrival.ramp_s
    if cfg.batching == "static" or (arrival.concurrency or 1) <= 1:
        return 0.0
    entry = cfg.disaggregation.prefill_replicas if cfg.disaggregation is not None else replicas
    batch = min(math.ceil((arrival.concurrency or 1) / max(entry, 1)), cfg.max_num_seqs)
    prompt, out = max(round(input_tokens), 1), max(round(output_tokens), 1)
    padded = cfg.max_num_seqs if cfg.engine == "neuron" else None
    step = cost.iteration_s((), batch, batch * (prompt + out // 2), padded_decodes=padded)
    return cost.iteration_s(((prompt, 0),)) + (out - 1) * step


def _cost(
    res: Resolved, cfg: ServingCfg, model: IterationModel, draft: IterationModel | None
) -> IterationCost:
    spec = cfg.speculative
    if draft is not None and spec is not None:
        return SpeculativeCost(model, draft, spec.tokens)
    return model


def _faults(res: Resolved, cfg: ServingCfg, model: IterationModel, n_rep: int) -> ServeFaults:
    """``failures.inject`` as replica events (:func:`~clustersim.serve.faults.serving_faults`)."""
    healthy = model.allreduce_s
    if not res.scenario.failures.inject or not isinstance(healthy, TpAllReduce):
        return ServeFaults([], [])

    def cost_with(allreduce: Callable[[float], float]) -> IterationCost:
        slow = iteration_model(res, cfg, allreduce=allreduce)
        return _cost(res, cfg, slow, draft_model(res, cfg, slow))

    return serving_faults(
        res, res.scenario.failures, tp=model.tp, replicas=n_rep, healthy=healthy,
        cost_with=cost_with, disaggregated=cfg.disaggregation is not None,
    )  # fmt: skip


def _stats(values: np.ndarray) -> dict[str, float | None]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"mean": float(values.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def iteration_frame(sim: ServeSim) -> pd.DataFrame:
    """Every replica's logged iterations (:data:`~clustersim.serve.sched.LOG_FIELDS`),
    with the replica's index, role and KV capacity, in order of replica and time."""
    frames = []
    for rep in sim.replicas:
        log = rep.log or []
        frame = pd.DataFrame.from_records(log, columns=list(LOG_FIELDS))
        frame.insert(0, "replica", rep.index)
        frame["role"] = rep.role
        frame["kv_capacity_blocks"] = rep.kv_blocks
        frames.append(frame)
    out = pd.concat(frames, ignore_index=True)
    for col in ("replica", "prefill_tokens", "sequences", "steps", "kv_blocks", "aborted"):
        out[col] = out[col].astype("int64")
    out["start_s"] = out["start_s"].astype("float64")
    out["duration_s"] = out["duration_s"].astype("float64")
    return out


def serve(res: Resolved, *, collective_overheads: bool = True, record: bool = False) -> ServeResult:
    """Simulate the scenario's requests; exit 2 (ScenarioError) on bad input.
    ``collective_overheads=False`` is a diagnostic (``iteration_model``'s ``overheads``);
    ``record`` logs every iteration (``ServeResult.iterations``, for the trace and report)."""
    t_wall = time.perf_counter()
    cfg = serving_of(res)
    model = iteration_model(res, cfg, overheads=collective_overheads)
    draft = draft_model(res, cfg, model)
    wl = workload(cfg, res.scenario.seed)
    blocks = kv_capacity(res, model, cfg, draft, wl.longest_input + wl.longest_output)
    n_rep = replicas_of(res, cfg)
    blocks, engines = virtual_engines(model, blocks, wl.longest_input + wl.longest_output)
    engines *= model.attention_dp  # each attention-DP group schedules its own batch
    spec = cfg.speculative
    iteration = _cost(res, cfg, model, draft)
    faults = _faults(res, cfg, model, n_rep)
    seed = res.scenario.seed
    split = cfg.disaggregation
    transfers: list[FabricKvTransfer] = []

    def transfer(env: simpy.Environment) -> FabricKvTransfer:
        transfers.append(FabricKvTransfer(env, res, model.tp, model.kv_bytes_per_token_per_rank))
        return transfers[-1]

    ramp = closed_loop_ramp_s(
        cfg, iteration, n_rep * engines, float(np.mean(wl.inputs)), float(np.mean(wl.outputs))
    )
    sim = ServeSim(
        [iteration] * (n_rep * engines), engine=cfg.engine, max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens, kv_blocks=blocks,
        requests=wl.requests, arrival=wl.rule, arrival_times=wl.times, dispatch=cfg.dispatch,
        seed=seed, input_tokens=wl.inputs, output_tokens=wl.outputs, ramp_s=ramp,
        prefix_hit=cfg.prefix_cache.hit_rate,
        slot_tokens=wl.longest_input + wl.longest_output,
        prefill_replicas=split.prefill_replicas if split is not None else 0,
        kv_transfer=transfer if split is not None else None,
        speculative=(spec.tokens, spec.acceptance) if spec is not None else None,
        static=cfg.batching == "static", faults=faults.faults, record=record,
    )  # fmt: skip
    frame = request_frame(sim.run())
    summary = _summary(res, model, sim, frame, blocks)
    if faults.records:
        summary["failures"] = {
            **failure_summary(faults, sim.fault_records, frame, float(sim.env.now)),
            "kv_tokens_lost": sum(r.kv_tokens_lost for r in sim.replicas),
            "detection_time_s": res.scenario.failures.detection_time,
            "restart_time_s": res.scenario.failures.restart_time,
        }
    if cfg.prefix_cache.hit_rate > 0:
        summary["prefix_cache"] = {
            "hit_rate": cfg.prefix_cache.hit_rate,
            "tokens_hit": sum(r.cached_tokens for r in sim.requests if not math.isnan(r.scheduled)),
        }
    if spec is not None:
        steps = sum(r.decode_steps for r in sim.replicas)
        summary["speculative"] = {
            "draft_model": spec.draft_model,
            "tokens": spec.tokens,
            "acceptance": spec.acceptance,
            "expected_tokens_per_step": expected_tokens_per_step(spec.tokens, spec.acceptance),
            "tokens_per_step": sum(r.decode_emitted for r in sim.replicas) / steps
            if steps
            else None,
        }
    if split is not None:
        summary["disaggregation"] = {
            "prefill_replicas": split.prefill_replicas,
            "decode_replicas": split.decode_replicas,
            "kv_transfer_s": _stats(frame["kv_transfer_s"].to_numpy(float)),
            "kv_bytes_moved": transfers[0].bytes_moved if transfers else 0.0,
        }
    summary["wall_s"] = time.perf_counter() - t_wall
    return ServeResult(summary, frame, iteration_frame(sim) if record else None)


def _summary(
    res: Resolved, model: IterationModel, sim: ServeSim, frame: pd.DataFrame, blocks: int
) -> dict[str, Any]:
    cfg = serving_of(res)
    finished = frame[np.isfinite(frame["finish_s"])]
    span = float(finished["finish_s"].max() - frame["arrival_s"].min()) if len(finished) else 0.0
    out_tokens = float(finished["output_tokens"].sum())
    in_tokens = float(finished["input_tokens"].sum())

    def rate(amount: float) -> float:
        return amount / span if span > 0 else 0.0

    slo = cfg.slo
    good = finished[(finished["ttft_s"] <= slo.ttft_s) & ~(finished["tpot_s"] > slo.tpot_s)]
    sc = res.scenario
    usd_hour = cost.usd_per_hour(res.instance, sc.cluster.count, sc.cost, res.chip)
    e = cost.energy(
        res.instance,
        res.chip,
        sc.cluster.count,
        sc.cost,
        step_time_s=span,
        tokens_per_step=out_tokens,
    )
    ttft, tpot = _stats(frame["ttft_s"].to_numpy(float)), _stats(frame["tpot_s"].to_numpy(float))
    return {
        "scenario": sc.name,
        "model": res.model.name,
        "chip": res.chip.name,
        "instance": res.instance.name,
        "instances": sc.cluster.count,
        "engine": cfg.engine,
        "engine_rules": cfg.engine,
        "batching": cfg.batching,
        "tp": model.tp,
        "replicas": len(sim.replicas) // model.pp,
        "pp": model.pp,
        "requests": len(frame),
        "requests_finished": len(finished),
        "arrival": cfg.arrival.model_dump(exclude_none=True),
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": _stats(frame["e2e_s"].to_numpy(float)),
        "queue_s": _stats(frame["queue_s"].to_numpy(float)),
        "makespan_s": span,
        "output_tokens_per_s": rate(out_tokens),
        "input_tokens_per_s": rate(in_tokens),
        "requests_per_s": rate(float(len(finished))),
        "goodput_requests_per_s": rate(float(len(good))),
        "slo": cfg.slo.model_dump(),
        "usd_per_hour": usd_hour,
        "usd_per_million_output_tokens": cost.usd_per_million_tokens(usd_hour, rate(out_tokens)),
        "usd_per_million_input_tokens": cost.usd_per_million_tokens(usd_hour, rate(in_tokens)),
        # the whole cluster at its rated power over the run, idle replicas included
        "energy": {
            "power_kw": e["power_kw"],
            "pue": e["pue"],
            "kwh": e["kwh_per_step"],
            "kwh_per_million_output_tokens": e["kwh_per_million_tokens"],
        },
        "uncertainty": uncertainty(res.chip.family, ttft["p50"], tpot["p50"]),
        "kv_cache_blocks_per_replica": blocks * model.pp,
        "kv_cache_tokens_per_replica": blocks * model.pp * BLOCK_TOKENS,
        "kv_cache_peak_fraction": max(r.peak_blocks for r in sim.replicas) / blocks,
        "weights_gib_per_rank": model.weight_bytes_per_rank / GIB,
        "preemptions": sum(r.preemptions for r in sim.replicas),
        "iterations": sum(r.iterations for r in sim.replicas),
        "replica_busy_s": [r.busy_s for r in sim.replicas],
        "software": {
            "stack": res.software.stack,
            "note": "the chips' catalog constants: serving runtimes are not fitted, and a "
            "training stack's fit is not theirs",
        },
    }
