"""``clustersim run`` on a trace workload (``workload: {chakra: PREFIX}``).

The cluster, its fabric (built or ``cluster.fabric_file``), the communication
runtime, HBM sharing and in-step failure injection are set up exactly as
:func:`clustersim.sim.run.simulate` sets them up; the workload is the traces,
run by :class:`~clustersim.sim.chakra_dag.DagSim` with rank r on chip
``r // ranks_per_chip`` (the placement ``run`` gives built workloads).

A compute node's time: ``compute: replay``, its ``duration_micros`` x ``scale``;
``compute: model``, the chip's roofline on ``num_ops`` (tensor FLOPs at
``training.precision``, at the chip's fitted tensor efficiency) and
``tensor_size`` (HBM bytes at the fitted HBM efficiency), plus the chip's op
overhead, as :class:`~clustersim.hardware.chip.ChipModel` times an op; a node
with neither keeps its duration. A memory node takes its duration, or its
``tensor_size`` at the rank's HBM rate.

HBM is shared with the flows on the chip as a built run shares it
(:mod:`clustersim.sim.hbm`): a run of compute ops, those that follow one another
with nothing between them, asks for its mean rate, its bytes over its time. In a
graph a run is a chain of compute nodes, each the only successor of the one
before and depending on it alone; each node of the chain asks for the chain's
mean rate (:func:`run_hbm_bytes`), so a memory-bound node amid matmuls is not
slowed more than the built run it came from.

The summary has the keys ``run`` writes for a built workload, but those a trace
leaves undefined: no model, so ``model_flops_per_step``, ``mfu``, ``hfu``,
tokens and the cost per token are null; ``layout`` is null; ``memory_gib_per_chip``
is absent. ``workload`` says what ran.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy
from numpy.typing import NDArray

from clustersim import cost
from clustersim._version import __version__
from clustersim.chakra.graph import Kind, RankGraph
from clustersim.chakra.traces import Traces, load_traces
from clustersim.errors import MISSING, ScenarioError
from clustersim.failures.injection import StepFailure
from clustersim.network import Network
from clustersim.network.fabric import check_fabrics
from clustersim.network.runtimes import runtime_of
from clustersim.scenario import Resolved
from clustersim.scenario.workload import ChakraCfg
from clustersim.sim.chakra_dag import DagSim
from clustersim.sim.fabric import fabric_graph_topology, scenario_topology
from clustersim.sim.hbm import ComputeRuns
from clustersim.sim.injected import build_injector, failed_step_keys

if TYPE_CHECKING:
    import pandas as pd

    from clustersim.failures.reliability import Outcome

__all__ = ["COMM_GROUP_FILE", "TraceResult", "node_seconds", "run_hbm_bytes", "simulate_trace"]

COMM_GROUP_FILE = "comm_group.json"


@dataclass
class TraceResult:
    """A simulated trace workload: the summary, the run and its traces (what
    :class:`~clustersim.sim.result.Result` is to a built one, with the same readers)."""

    resolved: Resolved
    summary: dict[str, Any]
    sim: DagSim
    traces: Traces
    reliability: list[Outcome] = field(default_factory=list)

    @property
    def network(self) -> Network:
        return self.sim.network

    def trace_frame(self) -> pd.DataFrame:
        """One row per node run, in the columns of a built run's trace."""
        from clustersim.sim.chakra_trace import trace_frame

        failed = self.summary.get("step_failed")
        at_s = failed["at_s"] if failed else None
        return trace_frame(self.sim, self.traces, self.resolved, failed_at_s=at_s)

    def engine_frame(self) -> None:
        """Traces run on the roofline: no engine chunks."""
        return

    def link_table(self) -> pd.DataFrame:
        from clustersim.trace.links import link_frame

        net = self.sim.network
        return link_frame(net.topology, net.flows.link_utilisation())


def node_seconds(g: RankGraph, res: Resolved, cfg: ChakraCfg) -> tuple[list[float], list[float]]:
    """Each node's time on its rank when it runs alone (seconds), and the HBM bytes it
    moves (what it shares with the flows on its chip); see the module doc."""
    chip, lnc = res.chip, res.lnc
    cal = chip.calibration
    hbm_Bps = chip.hbm_bw_Bps * cal.hbm_efficiency * lnc / chip.cores
    tensor = np.nan_to_num(g.tensor_size, nan=0.0)
    seconds = g.duration_us * 1e-6
    is_compute = g.kind == Kind.COMPUTE
    if cfg.compute == "model":
        precision = res.scenario.training.precision
        eff = cal.fp8_tensor_efficiency if precision == "fp8" else None
        peak = chip.core.tensor_tflops.get(precision) * 1e12 * lnc * (eff or cal.tensor_efficiency)
        ops = np.nan_to_num(g.num_ops, nan=0.0)
        modelled = is_compute & (~np.isnan(g.num_ops) | ~np.isnan(g.tensor_size))
        roofline = np.maximum(ops / peak, tensor / hbm_Bps) + cal.op_overhead_s
        seconds = np.where(modelled, roofline, seconds)
    else:
        seconds = np.where(is_compute, seconds * cfg.scale, seconds)
    memory = (g.kind == Kind.MEMORY) & (g.duration_us == 0)
    seconds = np.where(memory, tensor / hbm_Bps, seconds)
    hbm = run_hbm_bytes(g, seconds, np.where(is_compute, tensor, 0.0))
    return seconds.tolist(), hbm.tolist()


def run_hbm_bytes(
    g: RankGraph, seconds: NDArray[np.float64], hbm_bytes: NDArray[np.float64]
) -> NDArray[np.float64]:
    """Each node's HBM bytes at its run's mean rate: a compute node that is the only
    successor of a compute node, and depends on it alone, is in its run (see the
    module doc). Times are unchanged, and so is each run's total of bytes."""
    n = g.size
    if n == 0:
        return hbm_bytes
    compute = g.kind == Kind.COMPUTE
    ptr = g.succ_ptr
    single = np.flatnonzero(compute & (np.diff(ptr) == 1))
    nxt = g.succ[ptr[single]]
    link = compute[nxt] & (g.indegree[nxt] == 1)
    follows = np.full(n, -1, dtype=np.int64)  # the node a node continues the run of
    follows[nxt[link]] = single[link]
    nexts = np.full(n, -1, dtype=np.int64)
    nexts[single[link]] = nxt[link]
    run = np.full(n, -1, dtype=np.int64)
    heads = np.flatnonzero(compute & (follows < 0) & (nexts >= 0)).tolist()
    nx = nexts.tolist()
    for k, head in enumerate(heads):  # chains are disjoint: O(nodes) in all
        i = head
        while i >= 0:
            run[i] = k
            i = nx[i]
    chained = run >= 0
    if not chained.any():
        return hbm_bytes
    ids = run[chained]
    total_s = np.bincount(ids, weights=seconds[chained], minlength=len(heads))
    total_b = np.bincount(ids, weights=hbm_bytes[chained], minlength=len(heads))
    rate = np.divide(total_b, total_s, out=np.zeros_like(total_b), where=total_s > 0)
    out = hbm_bytes.copy()
    out[chained] = np.where(total_s[ids] > 0, seconds[chained] * rate[ids], hbm_bytes[chained])
    return out


def simulate_trace(
    res: Resolved,
    *,
    progress: Callable[[float], None] | None = None,
    record: bool = True,
    fidelity: str = "auto",
) -> TraceResult:
    """Simulate ``training.steps`` runs of the scenario's traces and summarise them."""
    t_wall = time.perf_counter()
    sc = res.scenario
    assert sc.workload is not None
    cfg = sc.workload.chakra
    if fidelity == "folded":
        raise ScenarioError("--fidelity", fidelity, "a trace workload runs every rank")
    if sc.failures.reliability:
        raise ScenarioError(
            "failures", MISSING, "the long-horizon model needs a model's tokens and checkpoint; "
            "a trace workload takes failures.inject only",
        )  # fmt: skip
    if sc.chip_model != "roofline":
        raise ScenarioError("chip_model", sc.chip_model, "a trace workload runs the roofline")
    if sc.cluster.fabric_file is None:
        check_fabrics(res.instance, sc.cluster.count)
    else:
        fabric_graph_topology(res)
    comm_groups = cfg.comm_groups
    if comm_groups is None:  # the group file beside the traces, if any
        beside = Path(cfg.prefix).parent / COMM_GROUP_FILE
        comm_groups = str(beside) if beside.is_file() else None
    traces = load_traces(
        cfg.prefix, res.ranks, replicate=cfg.replicate, comm_groups=comm_groups,
        drop_dangling_ctrl_deps=cfg.drop_dangling_ctrl_deps,
    )  # fmt: skip
    times: dict[int, tuple[list[float], list[float]]] = {}
    for g in traces.graphs:
        if id(g) not in times:
            times[id(g)] = node_seconds(g, res, cfg)
    env = simpy.Environment()
    topology = scenario_topology(res)
    rank_chip = np.arange(res.ranks, dtype=np.int64) // res.ranks_per_chip
    hbm_Bps = res.chip.hbm_bw_Bps * res.chip.calibration.hbm_efficiency
    network = Network(
        env, topology, rank_chip, sc.cluster.collectives,
        runtime=runtime_of(res.chip, res.instance, in_program=True), hbm_Bps=hbm_Bps,
    )  # fmt: skip
    injector = build_injector(env, topology, sc.failures)
    sim = DagSim(
        env, network, traces.graphs,
        [times[id(g)][0] for g in traces.graphs], [times[id(g)][1] for g in traces.graphs],
        traces.pg, traces.groups, traces.group_names, steps=sc.training.steps, record=record,
        progress=progress, serial_communicators=res.chip.runtime == "nccl",
        slowdown=injector.slowdown if injector is not None else None,
        rank_chip=rank_chip.tolist(),
    )  # fmt: skip
    sim.hbm = ComputeRuns(env, network.flows, rank_chip.tolist(), res.chip.collective_sm_fraction)
    failure: StepFailure | None = None
    try:
        sim.run()
    except StepFailure as exc:
        failure = exc
    wall = time.perf_counter() - t_wall
    summary = trace_summary(
        res, sim=sim, traces=traces, network=network, wall_s=wall, failure=failure
    )
    if injector is not None:
        summary["step_times_s"] = [float(t) for t in sim.step_times_s]
        summary["injections"] = injector.records
    return TraceResult(res, summary, sim, traces)


def trace_summary(
    res: Resolved,
    *,
    sim: DagSim,
    traces: Traces,
    network: Network,
    wall_s: float,
    failure: StepFailure | None,
) -> dict[str, Any]:
    """``summary.json`` of a trace workload (see the module doc)."""
    sc = res.scenario
    assert sc.workload is not None
    cfg = sc.workload.chakra
    head: dict[str, Any] = {
        "scenario": sc.name,
        "seed": sc.seed,
        "instance": res.instance.name,
        "instances": sc.cluster.count,
        "chip": res.chip.name,
        "model": None,
        "workload": {
            "chakra": cfg.prefix,
            "files": traces.files,
            "replicate": cfg.replicate,
            "compute": cfg.compute,
            "nodes_per_step": traces.nodes,
            "process_groups": len(traces.groups),
            "dropped_ctrl_deps": sum(g.dropped_ctrl_deps for g in traces.graphs[: traces.files]),
        },
        "chips": res.chips,
        "ranks": res.ranks,
        "layout": None,
    }
    events = sim.nodes_run + network.transfers_done
    tail = {
        "events": events,
        "events_per_s": events / wall_s if wall_s > 0 else 0.0,
        "wall_s": wall_s,
        "fidelity": "detailed",
        "chip_model": "roofline",
        "simulated_ranks": len(sim.graphs),
        "clustersim_version": __version__,
    }
    undefined = dict.fromkeys(
        ("tokens_per_step", "tokens_per_s", "sequences_per_s", "model_flops_per_step", "mfu", "hfu")
    )
    if failure is not None:
        return {
            **head,
            **failed_step_keys(failure, len(sim.step_ends), sim.step_times_s),
            **undefined,
            "breakdown_s": None,
            "cost": None,
            **tail,
        }
    step_s = float(np.mean(sim.step_times_s))
    n = len(sim.graphs) * sc.training.steps
    uses = sim.uses
    parts = {
        "compute": sum(u.compute_s for u in uses) / n,
        "exposed_comm": sum(u.exposed_comm_s for u in uses) / n,
        "bubble": 0.0,
        "optimizer": 0.0,
        "interference": sum(u.interference_s for u in uses) / n,
        "host": 0.0,  # a trace's nodes carry their own times
    }
    parts["other"] = max(step_s - sum(parts.values()), 0.0)
    usd_hour = cost.usd_per_hour(res.instance, sc.cluster.count, sc.cost, res.chip)
    energy = cost.energy(
        res.instance, res.chip, sc.cluster.count, sc.cost, step_time_s=step_s, tokens_per_step=0
    )
    energy.pop("kwh_per_million_tokens")
    return {
        **head,
        "step_time_s": step_s,
        **undefined,
        "breakdown_s": parts,
        "cost": {
            "pricing": sc.cost.pricing,
            "usd_per_hour": usd_hour,
            "usd_per_step": usd_hour * step_s / 3600.0,
            "usd_per_million_tokens": None,
        },
        "energy": energy,
        **tail,
    }
