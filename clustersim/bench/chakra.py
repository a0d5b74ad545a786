"""The bench cases of Chakra traces: loading a 200,000-node trace, and a Llama-3-8B
Trn2 step exported, imported and run.

``chakra-load`` writes one rank's trace of 200,000 nodes (a chain of compute nodes
with an all-reduce every 100th node) and times reading it back: decoding,
checking and compiling it into the arrays a simulation walks. ``chakra-8b``
exports ``scenarios/trn2-llama3-8b.yaml`` (64 ranks on one trn2.48xlarge) as
traces, simulates the built step, then imports the traces and runs them: the
figures are each phase's wall time and the round trip's step-time error.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["CHAKRA_8B_SCENARIO", "LOAD_NODES", "chain_trace", "chakra_8b", "chakra_load"]

LOAD_NODES = 200_000
"""Nodes of the ``chakra-load`` trace: the size the Chakra issue asks to load in 10 s."""
CHAKRA_8B_SCENARIO = "trn2-llama3-8b.yaml"
Phase = Callable[[str], None]
"""As :data:`clustersim.bench.cases.Phase`, which lists these cases."""


def chain_trace(nodes: int) -> bytes:
    """One rank's trace of ``nodes`` nodes: compute nodes in a chain, every 100th an
    all-reduce of 1 MiB over every rank, each depending on the node before."""
    from clustersim.chakra import Attr, EtFile, GlobalMetadata, Node, NodeType, encode_file

    cpu = Attr("is_cpu_op", "bool", False)
    comp = [cpu, Attr("num_ops", "int64", 2**30), Attr("tensor_size", "uint64", 2**24)]
    coll = [cpu, Attr("comm_type", "int64", 0), Attr("comm_size", "int64", 2**20)]
    out = []
    for i in range(nodes):
        deps = [i - 1] if i else []
        if i % 100 == 99:
            out.append(Node(i, f"ar{i}", NodeType.COMM_COLL_NODE, data_deps=deps, attrs=coll))
        else:
            node = Node(i, f"mm{i}", NodeType.COMP_NODE, data_deps=deps, attrs=comp)
            node.duration_micros = 13
            out.append(node)
    return encode_file(EtFile(GlobalMetadata("0.0.4"), out))


def chakra_load(phase: Phase) -> dict[str, Any]:
    from clustersim.chakra.traces import load_traces

    phase(f"writing a {LOAD_NODES:,}-node trace")
    data = chain_trace(LOAD_NODES)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "big.0.et").write_bytes(data)
        phase("loading it")
        t0, c0 = time.perf_counter(), time.process_time()
        traces = load_traces(str(Path(tmp) / "big"), 1, replicate=False)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "nodes": traces.nodes,
        "file_bytes": len(data),
        "load_wall_s": wall,
        "load_cpu_s": cpu,
        "nodes_per_s": traces.nodes / wall if wall > 0 else 0.0,
    }


def chakra_8b(phase: Phase, scenario: Path) -> dict[str, Any]:
    """``chakra-8b`` on ``scenario`` (``scenarios/trn2-llama3-8b.yaml``)."""
    from clustersim.scenario import load_scenario, resolve
    from clustersim.sim import simulate
    from clustersim.sim.chakra_export import export_chakra
    from clustersim.sim.run import compile_programs, plan

    res = load_scenario(scenario)
    with tempfile.TemporaryDirectory() as tmp:
        phase("exporting the step as traces")
        t0 = time.perf_counter()
        pl = plan(res)
        done = export_chakra(pl, compile_programs(pl), Path(tmp), "t")
        export_s = time.perf_counter() - t0
        phase("simulating the built step")
        built = simulate(res, record=False).summary
        phase("importing and running the traces")
        data = {
            "name": "trn2-llama3-8b-trace",
            "cluster": res.raw["cluster"],
            "workload": {"chakra": str(Path(tmp) / "t")},
            "training": {"steps": 1, "precision": res.scenario.training.precision},
        }
        t0 = time.perf_counter()
        imported = simulate(resolve(data), record=False).summary
        import_s = time.perf_counter() - t0
    step, back = float(built["step_time_s"]), float(imported["step_time_s"])
    return {
        "scenario": res.scenario.name,
        "ranks": res.ranks,
        "nodes": done.nodes,
        "trace_bytes": done.bytes,
        "export_wall_s": export_s,
        "built_wall_s": built["wall_s"],
        "import_wall_s": import_s,
        "events": imported["events"],
        "events_per_s": imported["events_per_s"],
        "step_time_s": back,
        "built_step_time_s": step,
        "round_trip_error": back / step - 1.0,
    }
