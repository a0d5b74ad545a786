"""From a resolved scenario to a ``Result``: plan, simulate, summarise."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import simpy

from clustersim import cost
from clustersim.catalog.fits import interval
from clustersim.catalog.reserve import runtime_reserve
from clustersim.errors import MISSING, ScenarioError
from clustersim.failures.injection import StepFailure, fold_with
from clustersim.failures.jobs import needs_degraded_step
from clustersim.failures.jobs import validate as validate_reliability
from clustersim.failures.studies import add_reliability
from clustersim.hardware.chip import ChipModel
from clustersim.hardware.engines import EngineChip
from clustersim.hardware.tiles import ENGINE_NAMES, TiledOp
from clustersim.names import check
from clustersim.network import OPS, Network, algorithm_names
from clustersim.network.fabric import check_fabrics
from clustersim.network.graphs import GraphTopology
from clustersim.network.runtimes import runtime_of
from clustersim.scenario import Resolved
from clustersim.sim.degraded import derive_degraded_step, healthy_only
from clustersim.sim.engine import CompiledProgram, StepSim, compile_program
from clustersim.sim.engines_exec import SegmentRun
from clustersim.sim.fabric import fabric_graph_topology, scenario_topology
from clustersim.sim.guard import Estimate, Limits, check_work, estimate
from clustersim.sim.hbm import ComputeRuns
from clustersim.sim.injected import build_injector, failed_summary
from clustersim.sim.partialfold import partial_fold_refusal
from clustersim.sim.result import Plan, Result
from clustersim.sim.summary_keys import run_identity, simulation_keys
from clustersim.workload import (
    build_programs,
    check_fits,
    make_layout,
    memory_check,
    memory_per_rank,
    model_flops_per_step,
    validate,
)
from clustersim.workload.titan import lowering_of

if TYPE_CHECKING:
    from clustersim.sim.chakra_run import TraceResult

__all__ = [
    "FOLD_ABOVE_RANKS",
    "Fidelity",
    "auto_folds",
    "degraded_step",
    "estimate_run",
    "plan",
    "simulate",
]

FOLD_ABOVE_RANKS = 256
"""``fidelity: auto`` simulates every rank up to this many, and folds above."""
Fidelity = Literal["auto", "detailed", "folded"]


def check_chip_model(res: Resolved) -> None:
    """``chip_model: engines`` needs the chip's engine description (``engines`` in the catalog)."""
    if res.scenario.chip_model == "engines" and res.chip.engines is None:
        from clustersim import catalog

        described = [n for n in catalog.names("chips") if catalog.chip(n).engines is not None]
        raise ScenarioError(
            "chip_model",
            "engines",
            f"chip {res.chip.name} has no engine description (give cluster.chip.engines, or "
            f"use roofline; chips with one: {', '.join(described)})",
        )


def check_collectives(collectives: Mapping[str, str]) -> None:
    """A ScenarioError naming ``cluster.collectives.<op>`` for an unknown collective or
    algorithm, with the closest valid name (the names are canonical already)."""
    for op, name in collectives.items():
        check("cluster.collectives", op, OPS, "unknown collective")
        valid = algorithm_names(op)
        if name not in valid:
            known = any(name in algorithm_names(other) for other in OPS)
            problem = f"algorithm does not implement {op}" if known else "unknown algorithm"
            check(f"cluster.collectives.{op}", name, valid, problem)


IN_NETWORK = ("sharp", "nvls_sharp")
"""Algorithms reduced in the scale-out switches (InfiniBand SHARP)."""


def check_in_network(res: Resolved) -> None:
    """Refuse an in-network all-reduce (``sharp``, ``nvls_sharp``) where the scale-out
    switches do not reduce (``efa.sharp``) or NCCL does not run (Trainium), and
    ``nvls_sharp`` without an NVSwitch that reduces, before anything is simulated."""
    inst = res.instance
    for op, name in res.scenario.cluster.collectives.items():
        if name not in IN_NETWORK:
            continue
        path = f"cluster.collectives.{op}"
        if res.chip.runtime != "nccl":
            raise ScenarioError(
                path, name, f"needs NCCL over InfiniBand SHARP; {res.chip.name} runs Neuron"
            )
        if not inst.efa.sharp:
            from clustersim import catalog

            have = [n for n in catalog.names("instances") if catalog.instance(n).efa.sharp]
            raise ScenarioError(
                path,
                name,
                f"needs switches that reduce in the network (efa.sharp); {inst.name}'s "
                f"scale-out network ({inst.efa.network}) has none; instances with it: "
                f"{', '.join(have)}",
            )
        if name == "nvls_sharp" and not res.chip.collectives.nvls:
            raise ScenarioError(path, name, f"needs NVLink SHARP; {res.chip.name} has none")


def check_precision(res: Resolved) -> None:
    """Refuse a training precision the chip's tensor engine does not have.

    ``precision: fp8`` needs an FP8 tensor rate in the chip's catalog entry (the
    A100 has none); it is never run silently at another precision.
    """
    precision = res.scenario.training.precision
    peaks = res.chip.core.tensor_tflops
    if precision == "fp8" and peaks.fp8 is None:
        raise ScenarioError(
            "training.precision",
            precision,
            f"{res.chip.name} has no FP8 tensor engine; use bf16 or fp16",
        )


def plan(
    res: Resolved, *, check_memory: bool = True, limits: Limits | None = None, folded: bool = False
) -> Plan:
    """Validate the layout against the model and cluster, and build the programs.

    With ``limits``, a run whose estimated events or memory exceed them is refused
    before the programs are built.
    """
    sc = res.scenario
    check_precision(res)
    layout = make_layout(sc.parallelism, res.ranks, res.ranks_per_chip, res.ranks_per_node)
    validate(res.model, sc.parallelism, sc.training, layout)
    if limits is not None:
        check_work(res, layout.dp, limits, folded=folded)
    check_collectives(sc.cluster.collectives)
    check_in_network(res)
    if sc.cluster.fabric_file is None:
        check_fabrics(res.instance, sc.cluster.count)
    else:
        fabric_graph_topology(res)  # read and checked: a ScenarioError naming the key
    check_chip_model(res)
    chip = ChipModel(res.chip, res.lnc)
    fits = check_fits if check_memory else memory_check
    mem_check = fits(
        res.model,
        sc.parallelism,
        sc.training,
        layout,
        chip.hbm_bytes_per_rank,
        reserve=runtime_reserve(res.chip),
        moe=sc.moe,
        seed=sc.seed,
    )
    memory = [
        memory_per_rank(
            res.model, sc.parallelism, sc.training, layout, stage, moe=sc.moe, seed=sc.seed
        )
        for stage in range(layout.pp)
    ]
    if sc.failures.reliability:
        validate_reliability(res)
    # torchtitan's eager or compiled elementwise kernels where its stack has the switch
    lowering = lowering_of(sc.software.compile, res.software.compile)
    programs = build_programs(
        res.model, sc.parallelism, sc.training, layout, moe=sc.moe, seed=sc.seed, lowering=lowering
    )
    return Plan(res, layout, chip, programs, memory, mem_check)


def compile_programs(pl: Plan) -> list[CompiledProgram]:
    """The plan's programs with op durations on its chip model (``chip_model``)."""
    sc = pl.resolved.scenario
    if sc.chip_model != "engines":
        return [compile_program(p, pl.chip) for p in pl.programs]
    engines = EngineChip(pl.resolved.chip, pl.resolved.lnc)
    cache: dict[tuple[TiledOp, ...], SegmentRun] = {}
    fuse = sc.parallelism.attention == "flash"
    return [
        compile_program(p, pl.chip, engines, fuse_attention=fuse, segment_cache=cache)
        for p in pl.programs
    ]


@contextmanager
def _frozen_heap() -> Iterator[None]:
    """The objects made so far (the plan, the topology, the programs: 10^5 of them) left out
    of the cyclic collector's full passes while the step runs, then handed back to it.

    They live until the run ends, so a full pass can free none of them; without this,
    each of the few full passes of a long run rescans them all. Left as it is when the
    caller froze objects of its own.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def simulate(
    res: Resolved,
    *,
    progress: Callable[[float], None] | None = None,
    record: bool = True,
    limits: Limits | None = None,
    fidelity: Fidelity = "auto",
) -> Result | TraceResult:
    """Simulate ``training.steps`` steps of the scenario and summarise them.

    A trace workload (``workload.chakra``) runs its traces instead
    (:func:`clustersim.sim.chakra_run.simulate_trace`), into a ``TraceResult``.

    ``fidelity``: ``detailed`` simulates every rank; ``folded`` one representative
    per pipeline stage, with every rank's traffic on the network (``sim.folding``);
    ``auto`` folds above ``FOLD_ABOVE_RANKS`` ranks, or where simulating every rank
    would exceed ``limits`` and folding would not (:func:`auto_folds`), unless
    ``failures.inject`` breaks
    the symmetry folding needs (``failures.injection.fold_with``) or a partly filled
    last NVLink domain splits groups unlike (``sim.partialfold``). ``limits`` bounds
    the work (default ``Limits()``): bigger runs are refused. A chip or instance
    injected down fails the step: the summary says so (``sim.injected``).
    """
    t_wall = time.perf_counter()
    if fidelity not in ("auto", "detailed", "folded"):
        raise ScenarioError("--fidelity", fidelity, "expected auto, detailed or folded")
    if res.scenario.workload is not None:
        from clustersim.sim.chakra_run import simulate_trace

        return simulate_trace(res, progress=progress, record=record, fidelity=fidelity)
    folded = fidelity == "folded" or (fidelity == "auto" and auto_folds(res, limits))
    folded = fold_with(res.scenario.failures.inject, folded, fidelity)
    sc = res.scenario
    topology = None
    refused: str | None = None
    summary_refusal: str | None = None
    if sc.cluster.fabric_file is not None:  # read first: its graph decides whether to fold
        topology = scenario_topology(res)
        if folded and isinstance(topology, GraphTopology) and topology.fold_refusal:
            refused = topology.fold_refusal
            if fidelity == "folded":
                raise ScenarioError("--fidelity", fidelity, f"cannot fold: {refused}")
            folded = False
    if folded and refused is None:
        layout = make_layout(sc.parallelism, res.ranks, res.ranks_per_chip, res.ranks_per_node)
        partial = partial_fold_refusal(res, layout)
        if partial is not None:
            if fidelity == "folded":
                raise ScenarioError("--fidelity", fidelity, f"cannot fold: {partial}")
            summary_refusal, folded = partial, False
    pl = plan(res, limits=limits or Limits(), folded=folded)
    env = simpy.Environment()
    if topology is None:
        topology = scenario_topology(res)
    rank_chip = np.arange(res.ranks, dtype=np.int64) // res.ranks_per_chip
    # HBM is shared, not split: each chip's sustained bandwidth is one capacity of the
    # max-min solve, loaded by the flows that start or end on it and by its compute.
    hbm_Bps = res.chip.hbm_bw_Bps * res.chip.calibration.hbm_efficiency
    runtime = runtime_of(res.chip, res.instance, in_program=True)
    network = Network(
        env, topology, rank_chip, sc.cluster.collectives, runtime=runtime, hbm_Bps=hbm_Bps
    )
    injector = build_injector(env, topology, sc.failures)
    compiled = compile_programs(pl)
    sim = StepSim(
        env, network, pl.layout, compiled, sc.training.steps, record, progress, folded=folded,
        slowdown=injector.slowdown if injector is not None else None,
        chip_model=sc.chip_model, serial_communicators=res.chip.runtime == "nccl",
        host_op_s=sc.software.host_op_s or 0.0,
    )  # fmt: skip
    sim.hbm = ComputeRuns(
        env, network.flows, [pl.layout.chip_of(r) for r in sim.ranks],
        res.chip.collective_sm_fraction,
    )  # fmt: skip
    try:
        with _frozen_heap():
            sim.run()
    except StepFailure as failure:
        wall = time.perf_counter() - t_wall
        summary = failed_summary(pl, sim, network, injector, failure=failure, wall_s=wall)
        return Result(pl, summary, sim, compiled)
    wall = time.perf_counter() - t_wall
    summary = summarise(pl, sim, compiled, network, wall)
    if summary_refusal is not None:
        summary["fold_refused"] = summary_refusal
    if injector is not None:
        summary["step_times_s"] = [float(t) for t in sim.step_times_s]
        summary["injections"] = injector.records
    if sc.cluster.fabric_file is not None:
        summary["fabric_file"] = {
            "path": sc.cluster.fabric_file,
            "nodes": topology.n_nodes,
            "links": topology.n_links - topology.n_chips,
            "fold_refused": refused,
            "symmetry_proven": isinstance(topology, GraphTopology) and not topology.fold_refusal,
        }
    degraded = None
    if needs_degraded_step(res):  # continue_degraded without a degraded step time
        degraded = derive_degraded_step(
            res, network, summary["step_time_s"], simulate, limits=limits
        )
    outcomes = add_reliability(res, summary, degraded=degraded)
    return Result(pl, summary, sim, compiled, outcomes)


def summarise(
    pl: Plan, sim: StepSim, compiled: list[CompiledProgram], network: Network, wall_s: float
) -> dict[str, Any]:
    res, sc, layout = pl.resolved, pl.resolved.scenario, pl.layout
    steps = sc.training.steps
    step_s = float(np.mean(sim.step_times_s))
    tokens = sc.training.global_batch_size * sc.training.seq_len
    peak = pl.chip.peak_flops(sc.training.precision) * res.chips
    model_flops = model_flops_per_step(res.model, sc.training)
    ranks_per_stage = layout.ranks // layout.pp
    hw_flops = sum(c.tensor_flops for c in compiled) * ranks_per_stage
    recompute_flops = sum(c.recompute_flops for c in compiled) * ranks_per_stage
    # HFU counts recomputation on top of the PaLM model FLOPs: scale MFU by the ratio
    # of executed FLOPs with and without the recomputed ops.
    recompute_factor = (
        hw_flops / (hw_flops - recompute_flops) if hw_flops > recompute_flops else 1.0
    )
    # Average the per-rank accounting; "other" is what is left of the step (waiting at
    # the end-of-step barrier for slower ranks), so the parts add up to the step time.
    n = len(sim.ranks) * steps
    parts = {
        "compute": sum(t.compute_s for t in sim.times) / n,
        "exposed_comm": sum(t.exposed_comm_s for t in sim.times) / n,
        "bubble": sum(t.bubble_s for t in sim.times) / n,
        "optimizer": sum(t.optimizer_s for t in sim.times) / n,
        # compute time lost to HBM (and SMs) shared with collectives running beside it
        "interference": sum(t.interference_s for t in sim.times) / n,
        # waiting for the host to issue the next op (software.host_op_s)
        "host": sum(t.host_s for t in sim.times) / n,
    }
    parts["other"] = max(step_s - sum(parts.values()), 0.0)
    usd_hour = cost.usd_per_hour(res.instance, sc.cluster.count, sc.cost, res.chip)
    tokens_per_s = tokens / step_s
    low, high, basis = interval(res.chip.name, step_s, stack=res.software.stack)
    return {
        **run_identity(pl),
        "step_time_s": step_s,
        "tokens_per_step": tokens,
        "tokens_per_s": tokens_per_s,
        "sequences_per_s": sc.training.global_batch_size / step_s,
        "model_flops_per_step": model_flops,
        "hardware_flops_per_step": hw_flops,
        "mfu": model_flops / (step_s * peak),
        "hfu": model_flops * recompute_factor / (step_s * peak),
        "breakdown_s": parts,
        "uncertainty": {
            "step_time_s": [low, high],
            "tokens_per_s": [tokens / high, tokens / low],
            "basis": basis,
        },
        "memory_gib_per_chip": pl.memory_gib_per_chip(),
        "memory_check": pl.memory_check_summary(),
        "cost": {
            "pricing": sc.cost.pricing,
            "usd_per_hour": usd_hour,
            "usd_per_million_tokens": cost.usd_per_million_tokens(usd_hour, tokens_per_s),
        },
        "energy": cost.energy(
            res.instance,
            res.chip,
            sc.cluster.count,
            sc.cost,
            step_time_s=step_s,
            tokens_per_step=tokens,
        ),
        **simulation_keys(sim, network, wall_s),
        **engine_busy(compiled, step_s),
    }


def engine_busy(compiled: list[CompiledProgram], step_s: float) -> dict[str, Any]:
    """``engine_busy``: with the engine model, the fraction of the step each engine of a
    rank's cores works (``tensor, vector, scalar, gpsimd, dma``) and its HBM share is
    busy, averaged over the pipeline stages. Empty with the roofline model."""
    busy = [c.engine_busy_s for c in compiled if c.engine_busy_s is not None]
    if not busy or step_s <= 0:
        return {}
    mean = np.mean(busy, axis=0) / step_s
    return {"engine_busy": dict(zip((*ENGINE_NAMES, "hbm"), map(float, mean), strict=True))}


def degraded_step(res: Resolved, *, limits: Limits | None = None) -> dict[str, Any] | None:
    """The derived degraded step time of ``res`` (see :mod:`clustersim.sim.degraded`),
    from a healthy step simulated first; None when the scenario needs none."""
    if not needs_degraded_step(res):
        return None
    healthy = simulate(healthy_only(res), record=False, limits=limits)
    step = healthy.summary["step_time_s"]
    if step is None:  # an injected chip or instance down failed the healthy step
        raise ScenarioError(
            "failures.degraded_step_time", MISSING, "cannot be derived: the step failed"
        )
    return derive_degraded_step(res, healthy.sim.network, step, simulate, limits=limits)


def auto_folds(res: Resolved, limits: Limits | None = None) -> bool:
    """Whether ``fidelity: auto`` folds ``res``: above ``FOLD_ABOVE_RANKS`` ranks, or
    where every rank simulated would be refused by ``limits`` (events or memory) and
    one representative per stage would not (a 256-GPU MoE step of 512 microbatches)."""
    if res.ranks > FOLD_ABOVE_RANKS or res.model is None:
        return res.ranks > FOLD_ABOVE_RANKS
    sc, limits = res.scenario, limits or Limits()
    dp = make_layout(sc.parallelism, res.ranks, res.ranks_per_chip, res.ranks_per_node).dp
    trace = sc.output.trace
    whole, one = (estimate(res, dp, trace=trace, folded=f) for f in (False, True))

    def fits(e: Estimate) -> bool:
        return e.events <= limits.max_events and e.memory_bytes <= limits.max_memory_bytes

    return not fits(whole) and fits(one)


def estimate_run(res: Resolved, fidelity: Fidelity = "auto") -> Estimate:
    """The work of ``simulate(res, fidelity=fidelity)`` as its guard estimates it: at
    the fidelity it will run at, plus the detailed step with a link cut when a
    ``continue_degraded`` step time is to be derived (``sim.degraded``)."""
    sc = res.scenario
    dp = make_layout(sc.parallelism, res.ranks, res.ranks_per_chip, res.ranks_per_node).dp
    folded = fidelity == "folded" or (fidelity == "auto" and auto_folds(res))
    try:
        folded = fold_with(sc.failures.inject, folded, fidelity)
    except ScenarioError:
        folded = False  # such a run is refused; count the detailed run it asks for
    est = estimate(res, dp, trace=sc.output.trace, folded=folded)
    if needs_degraded_step(res):
        cut = estimate(res, dp, trace=False, folded=False)
        est = Estimate(
            est.events + cut.events, max(est.memory_bytes, cut.memory_bytes), est.ops_per_rank
        )
    return est
