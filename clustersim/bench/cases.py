"""The benchmark cases: what each one runs, inside its own child process.

Each case is a function ``(phase) -> figures``: it does the work it measures and
returns a mapping of its figures; ``phase(text)`` tells the parent how far it
got, so a case stopped at its timeout can say where it was. The runner
(``bench.runner``) times the whole case and reads its peak memory.

Event counts. clustersim's ``events`` (in ``summary.json``) counts executed ops
and network transfers: a run of consecutive compute ops is one SimPy timeout but
several ops, and a collective is one fluid transfer per phase however many
rounds it stands for. The SimPy-level count is the number of events the kernel
scheduled (timeouts, process starts and ends, the events of rendezvous and
mailboxes): SimPy numbers every scheduled event from one counter to break ties,
so reading that counter after the run costs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clustersim.bench.chakra import CHAKRA_8B_SCENARIO, LOAD_NODES, chakra_8b, chakra_load

__all__ = [
    "ALL_TO_ALL_INSTANCES",
    "CASES",
    "DENSE_ALL_TO_ALL",
    "FOLD_CHIPS",
    "MOE_CHIPS",
    "SERVE_CASES",
    "Case",
    "Phase",
    "fold_scenario",
    "run_simpy",
    "scenario_path",
    "serve_scenario",
    "ultraserver_scenario",
]

Phase = Callable[[str], None]
"""Reports the phase a case has reached (one short line of text)."""

SIMPY_PROCESSES = 100
SIMPY_TIMEOUTS = 10_000
"""The bare SimPy loop: this many processes, each yielding this many ``timeout(1)``."""

ULTRASERVER_SCENARIO = "trn2-ultraserver-llama3-70b.yaml"
GPU_SCENARIO = "p5-qwen3-30b-a3b.yaml"
"""A GPU step whose collectives overlap compute (NCCL taking SMs from it)."""
MOE_SCENARIO = "trn2-ultracluster-deepseek-v3.yaml"
CHIPS_PER_INSTANCE = 16  # trn2.48xlarge, trn2u.48xlarge
FOLD_MICROBATCHES = 4
"""Microbatches per data-parallel replica in the folded cases: the global batch
grows with dp, so every point of the scaling table does the same work per rank."""

FOLD_TEMPLATE = """\
name: bench-trn2-llama3-405b-{chips}
description: Llama-3-405B on {chips:,} Trainium2 chips ({count:,} x trn2.48xlarge), benchmark.
seed: 0
cluster:
  instance: trn2.48xlarge
  count: {count}{efa}
model: llama3-405b
parallelism:
  tp: 8              # two chips at LNC=2
  pp: 16             # 126 layers: uneven, the outer stages get fewer
  uneven_stages: true
  zero: 1
  microbatch_size: 1
  schedule: 1f1b
  recompute: full
training:
  seq_len: 8192
  global_batch_size: {batch}   # dp x {microbatches} microbatches
  precision: bf16
  steps: 1
output:
  trace: false
"""

FOLD_CHIPS: dict[str, int] = {
    "fold-1k": 1024,
    "fold-4k": 4096,
    "fold-16k": 16_384,
    "fold-64k": 65_536,
    "fold-256k": 262_144,
    "fold-1m": 1_048_576,
}
"""The folded cases by chip count: c is ``fold-16k``, d is ``fold-1m``."""

FAT_TREE_CHIPS: dict[str, int] = {"fattree-16k": 16_384, "fattree-1m": 1_048_576}
"""The folded cases on a fat tree oversubscribed 2:1 at the top tier (:func:`fat_tree`)."""

MOE_CHIPS: dict[str, int] = {"moe-16k": 16_384, "moe-128k": 131_072}
"""The folded DeepSeek-V3 steps (``scenarios/trn2-ultracluster-deepseek-v3.yaml``, its
layout and batch, on as many trn2u.48xlarge as these chips take)."""

ALL_TO_ALL_INSTANCES: dict[str, int] = {"a2a-256": 16, "a2a-4k": 256}
"""The all-to-all cases: 64 MiB over one rank per chip of this many trn2.48xlarge
(256 and 4,096 ranks)."""
ALL_TO_ALL_BYTES = 2.0**26
DENSE_ALL_TO_ALL: dict[str, str] = {"a2a-1024-switch": "switch", "a2a-1024-ring": "ring"}
"""The dense-traffic cases: 64 MiB all-to-all over 1,024 chips on a fabric file of this
shape (:mod:`clustersim.bench.fabrics`), run as ``clustersim collective`` would."""


@dataclass(frozen=True)
class Case:
    name: str
    title: str
    run: Callable[[Phase], dict[str, Any]]
    preload: bool = True
    """Whether the child imports the simulator before the case's clock starts. A case
    that runs the CLI as a user would (``False``) is judged on the child's whole life
    (``process_s``), imports included."""


def fat_tree(chips: int) -> str:
    """The EFA fabric of an UltraCluster of ``chips`` Trn2 chips: a Clos of radix-64
    switches, non-blocking within a pod and 2:1 oversubscribed into the top tier
    (3 tiers up to 65,536 chips, 4 beyond)."""
    tiers = 3 if chips <= 65_536 else 4
    return (
        f"\n  efa: {{fabric: fat_tree, tiers: {tiers}, radix: 64, oversubscription: 2, "
        "oversubscription_at: top}"
    )


def fold_scenario(chips: int, *, fabric: bool = False) -> str:
    """The YAML of the Llama-3-405B layout of cases c, d and f on ``chips`` Trn2 chips,
    on the non-blocking fabric or (``fabric``) on :func:`fat_tree`."""
    count = chips // CHIPS_PER_INSTANCE
    # 4 ranks per chip at LNC=2, tp 8 x pp 16 = 128 ranks per replica.
    dp = chips * 4 // (8 * 16)
    batch = dp * FOLD_MICROBATCHES
    return FOLD_TEMPLATE.format(
        chips=chips,
        count=count,
        batch=batch,
        microbatches=FOLD_MICROBATCHES,
        efa=fat_tree(chips) if fabric else "",
    )


def scenario_path(name: str) -> Path:
    """``scenarios/NAME`` of the source tree (or the cwd)."""
    root = Path(__file__).resolve().parents[2]
    for base in (root, Path.cwd()):
        path = base / "scenarios" / name
        if path.is_file():
            return path
    raise FileNotFoundError(f"scenarios/{name} not found under {root} or the current directory")


def ultraserver_scenario() -> Path:
    """``scenarios/trn2-ultraserver-llama3-70b.yaml`` of the source tree (or the cwd)."""
    return scenario_path(ULTRASERVER_SCENARIO)


def _scheduled(env: Any) -> int | None:
    """Events the SimPy environment has scheduled so far (its tie-break counter)."""
    counter = getattr(env, "_eid", None)
    try:
        return int(next(counter)) if counter is not None else None
    except (TypeError, StopIteration):  # a SimPy that numbers events another way
        return None


def run_simpy(
    phase: Phase, processes: int = SIMPY_PROCESSES, timeouts: int = SIMPY_TIMEOUTS
) -> dict[str, Any]:
    """Bare SimPy: ``processes`` processes, each yielding ``timeouts`` x ``timeout(1)``."""
    import simpy

    env = simpy.Environment()

    def loop() -> Generator[simpy.Event, Any, None]:
        for _ in range(timeouts):
            yield env.timeout(1)

    for _ in range(processes):
        env.process(loop())
    phase("running the SimPy loop")
    t0 = time.perf_counter()
    env.run()
    wall = time.perf_counter() - t0
    events = processes * timeouts
    return {
        "processes": processes,
        "timeouts_per_process": timeouts,
        "events": events,
        "simpy_events": _scheduled(env),
        "loop_wall_s": wall,
        "events_per_s": events / wall if wall > 0 else 0.0,
    }


def _simulate(
    phase: Phase, source: str | Path, fidelity: str, overrides: tuple[str, ...] = ()
) -> dict[str, Any]:
    from clustersim.scenario import load_scenario
    from clustersim.sim import simulate

    phase("loading the scenario")
    res = load_scenario(source, overrides)
    phase("planning, building the topology")
    last = [0.0]

    def progress(fraction: float) -> None:
        now = time.perf_counter()
        if now - last[0] >= 1.0:  # one line a second at most
            last[0] = now
            phase(f"simulating, {fraction:.0%} of the step")

    result = simulate(
        res,
        fidelity="detailed" if fidelity == "detailed" else "folded",
        record=False,
        progress=progress,
    )
    s = result.summary
    simpy_events = _scheduled(result.sim.env)
    lay = s["layout"]
    return {
        "scenario": s["scenario"],
        "fidelity": s["fidelity"],
        "chips": s["chips"],
        "instances": s["instances"],
        "ranks": s["ranks"],
        "simulated_ranks": s["simulated_ranks"],
        "layout": f"tp {lay['tp']} pp {lay['pp']} dp {lay['dp']}, {lay['microbatches']} mb",
        "global_batch_size": res.scenario.training.global_batch_size,
        "step_time_s": s["step_time_s"],
        "events": s["events"],
        "sim_wall_s": s["wall_s"],
        "events_per_s": s["events_per_s"],
        "simpy_events": simpy_events,
        "simpy_events_per_s": (
            simpy_events / s["wall_s"] if simpy_events is not None and s["wall_s"] > 0 else None
        ),
    }


def _ultraserver(phase: Phase) -> dict[str, Any]:
    return _simulate(phase, ultraserver_scenario(), "detailed")


def _fold(chips: int, *, fabric: bool = False) -> Callable[[Phase], dict[str, Any]]:
    def run(phase: Phase) -> dict[str, Any]:
        return _simulate(phase, fold_scenario(chips, fabric=fabric), "folded")

    return run


def _moe(chips: int) -> Callable[[Phase], dict[str, Any]]:
    def run(phase: Phase) -> dict[str, Any]:
        count = f"cluster.count={chips // CHIPS_PER_INSTANCE}"
        return _simulate(phase, scenario_path(MOE_SCENARIO), "folded", (count,))

    return run


def _run_collective(
    phase: Phase, what: str, instances: int, op: str, nbytes: float, *, algorithm: str = "auto"
) -> dict[str, Any]:
    """One collective on ``instances`` trn2.48xlarge, as the bench reports it."""
    from clustersim.network.microbench import run_collective

    phase(f"building the topology, running the {what}")
    (row,) = run_collective("trn2.48xlarge", instances, op, [nbytes], algorithm=algorithm)
    return {
        "instances": instances,
        "ranks": row["ranks"],
        "op": row["op"],
        "algorithm": row["algorithm"],
        "size_bytes": row["size_bytes"],
        "collective_time_s": row["time_s"],
        "busbw_GBps": row["busbw_GBps"],
    }


def _all_to_all(instances: int) -> Callable[[Phase], dict[str, Any]]:
    def run(phase: Phase) -> dict[str, Any]:
        return _run_collective(phase, "all-to-all", instances, "all_to_all", ALL_TO_ALL_BYTES)

    return run


def _collective(phase: Phase) -> dict[str, Any]:
    return _run_collective(phase, "collective", 64, "all_reduce", 2.0**30, algorithm="ring")


SERVE_TEMPLATE = """\
name: bench-{name}
description: {description}
seed: 0
cluster: {{instance: {instance}, count: {count}}}
model: llama3-8b
parallelism: {{tp: 8}}
serving:
  engine: neuron
  max_num_seqs: 16
  max_num_batched_tokens: 512
  arrival: {{kind: poisson, rate_per_s: {rate}}}
  requests: {requests}
  input_tokens: 512
  output_tokens: 256
"""
SERVE_CASES: dict[str, dict[str, Any]] = {
    "serve-trn2": {
        "instance": "trn2.48xlarge", "count": 1, "rate": 10, "requests": 10_000,
        "description": "10,000 Poisson requests at 10/s, Llama-3-8B 512 in / 256 out, "
        "8 TP8 replicas on one trn2.48xlarge",
    },
    "serve-ultraserver": {
        "instance": "trn2u.48xlarge", "count": 4, "rate": 50, "requests": 180_000,
        "description": "one simulated hour at 50 requests/s (180,000), Llama-3-8B 512 in / "
        "256 out, 32 TP8 replicas on a Trn2 UltraServer",
    },
}  # fmt: skip
"""The serving issue's two performance cases (Neuron's rules, Llama-3-8B, 512 / 256)."""


def serve_scenario(name: str) -> str:
    """The YAML of serving bench case ``name``."""
    return SERVE_TEMPLATE.format(name=name, **SERVE_CASES[name])


def _serve(name: str) -> Callable[[Phase], dict[str, Any]]:
    def run(phase: Phase) -> dict[str, Any]:
        from clustersim.scenario import load_scenario
        from clustersim.serve.run import serve

        phase("loading the scenario")
        res = load_scenario(serve_scenario(name))
        phase("simulating the requests")
        start = time.perf_counter()
        s = serve(res).summary
        return {
            "scenario": s["scenario"],
            "requests": s["requests_finished"],
            "replicas": s["replicas"],
            "instances": s["instances"],
            "instance": s["instance"],
            "simulated_s": s["makespan_s"],
            "iterations": s["iterations"],
            "ttft_p50_s": s["ttft_s"]["p50"],
            "tpot_p50_s": s["tpot_s"]["p50"],
            "sim_wall_s": time.perf_counter() - start,
        }

    return run


SERVE_SEARCH_SCENARIO = "serve-trn2-llama3-70b.yaml"
SERVE_SEARCH_RATE = 16.0
SERVE_SEARCH_TPOT_S = 0.1
"""The capacity search bench case: Llama-3-70B at 16 requests/s over every default
instance type, TTFT p90 <= 2 s and TPOT p90 <= 100 ms (the README's comparison)."""


def _serve_search(phase: Phase) -> dict[str, Any]:
    from clustersim.scenario import load_scenario
    from clustersim.serve.capacity import serve_search

    phase("loading the scenario")
    res = load_scenario(
        scenario_path(SERVE_SEARCH_SCENARIO), [f"serving.slo.tpot_s={SERVE_SEARCH_TPOT_S}"]
    )
    phase("searching")
    result = serve_search(res, SERVE_SEARCH_RATE)
    meta, pick = result.meta, result.pick or {}
    return {
        "scenario": meta["scenario"],
        "rate_per_s": meta["rate_per_s"],
        "layouts": meta["layouts"],
        "layouts_skipped": meta["layouts_skipped"],
        "simulated": meta["simulated"],
        "pick": f"{pick['instances']} x {pick['instance']}, tp {pick['tp']}" if pick else None,
        "pick_usd_per_million_output_tokens": pick.get("usd_per_million_output_tokens"),
        "search_wall_s": meta["wall_s"],
    }


def _dense_all_to_all(shape: str) -> Callable[[Phase], dict[str, Any]]:
    """64 MiB all-to-all (``mesh``) over 1,024 chips of a ``shape`` fabric file, as
    ``clustersim collective --fabric-file`` runs it, in a child that imports nothing
    beforehand (its ``process_s`` is the CLI's whole process, less the printing)."""

    def run(phase: Phase) -> dict[str, Any]:
        import tempfile

        from clustersim.bench.fabrics import FABRIC_CHIPS, write_fabric
        from clustersim.network.microbench import run_collective

        with tempfile.TemporaryDirectory() as tmp:
            path = write_fabric(shape, Path(tmp) / f"{shape}.json")
            phase(f"the all-to-all on the {shape} fabric file")
            (row,) = run_collective(
                "trn2.48xlarge",
                FABRIC_CHIPS // CHIPS_PER_INSTANCE,
                "all_to_all",
                [ALL_TO_ALL_BYTES],
                algorithm="mesh",
                fabric_file=str(path),
            )
        return {
            "fabric": shape,
            "ranks": row["ranks"],
            "op": row["op"],
            "algorithm": row["algorithm"],
            "size_bytes": row["size_bytes"],
            "collective_time_s": row["time_s"],
            "busbw_GBps": row["busbw_GBps"],
        }

    return run


def _chips_label(chips: int) -> str:
    return f"{chips:,} Trn2 chips ({chips // CHIPS_PER_INSTANCE:,} x trn2.48xlarge)"


CASES: dict[str, Case] = {
    "simpy": Case(
        "simpy",
        f"bare SimPy: {SIMPY_PROCESSES} processes x {SIMPY_TIMEOUTS:,} timeouts",
        run_simpy,
    ),
    "ultraserver": Case("ultraserver", "Trn2 UltraServer Llama-3-70B step, detailed", _ultraserver),
    "p5-moe": Case(
        "p5-moe",
        "Qwen3-30B-A3B step on 2 x p5.48xlarge (16 H100), detailed",
        lambda phase: _simulate(phase, scenario_path(GPU_SCENARIO), "detailed"),
    ),
    "collective": Case(
        "collective", "ring all-reduce of 1 GiB over 1,024 ranks (64 x trn2.48xlarge)", _collective
    ),
    **{
        name: Case(
            name,
            f"all-to-all of 64 MiB over {n * CHIPS_PER_INSTANCE:,} ranks ({n} x trn2.48xlarge)",
            _all_to_all(n),
        )
        for name, n in ALL_TO_ALL_INSTANCES.items()
    },
    **{
        name: Case(
            name,
            f"all-to-all of 64 MiB over 1,024 chips, {shape} fabric file, whole process",
            _dense_all_to_all(shape),
            preload=False,
        )
        for name, shape in DENSE_ALL_TO_ALL.items()
    },
    **{
        name: Case(name, f"Llama-3-405B step on {_chips_label(chips)}, folded", _fold(chips))
        for name, chips in FOLD_CHIPS.items()
    },
    **{
        name: Case(
            name,
            f"Llama-3-405B step on {_chips_label(chips)}, fat tree 2:1 at the top, folded",
            _fold(chips, fabric=True),
        )
        for name, chips in FAT_TREE_CHIPS.items()
    },
    **{
        name: Case(
            name,
            f"DeepSeek-V3 step on {chips:,} Trn2 chips "
            f"({chips // CHIPS_PER_INSTANCE:,} x trn2u.48xlarge), folded",
            _moe(chips),
        )
        for name, chips in MOE_CHIPS.items()
    },
    **{
        name: Case(name, str(spec["description"]), _serve(name))
        for name, spec in SERVE_CASES.items()
    },
    "chakra-load": Case(
        "chakra-load", f"Chakra trace of {LOAD_NODES:,} nodes: decode, check, compile", chakra_load
    ),
    "chakra-8b": Case(
        "chakra-8b",
        "Llama-3-8B step on one trn2.48xlarge: exported as Chakra traces, imported and run",
        lambda phase: chakra_8b(phase, scenario_path(CHAKRA_8B_SCENARIO)),
    ),
    "serve-search": Case(
        "serve-search",
        "serve-search of Llama-3-70B at 16 requests/s over trn2, trn1, inf2, p5 and p5en",
        _serve_search,
    ),
}
"""Every case, in the order a full bench runs them (quick ones first)."""
