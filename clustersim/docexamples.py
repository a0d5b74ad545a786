"""Example runs the documentation quotes that need the simulator and the network.

Each entry of :data:`BLOCKS` is ``(name, compute, noise, what, pages)``: a generated
block of ``python -m clustersim.docs`` (which wraps it in its ``Figure``), computed
from the shipped scenarios.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clustersim.doccommands import clustersim_command

__all__ = [
    "BLOCKS",
    "ROUND_TRIPS",
    "chakra_example",
    "chakra_round_trip",
    "chakra_round_trips",
    "fabric_error",
    "sharding_check",
    "sharp_example",
]

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"


SHARDING_CHECK = (
    "mbridge-llama3-8b-fsdp",
    ("parallelism.dp_shard=2", "parallelism.recompute=full"),
)
"""The sharding page's ``clustersim check``: a scenario and its ``--set`` values."""


def sharding_check(ctx: object = None) -> str:
    """The sharding line ``clustersim check`` prints for :data:`SHARDING_CHECK`, fenced
    with its command as the page quotes it."""
    del ctx
    scenario, sets = SHARDING_CHECK
    argv = ["check", f"scenarios/{scenario}.yaml", *(w for s in sets for w in ("--set", s))]
    code, out, err = clustersim_command(argv, ROOT)
    lines = [line for line in out.splitlines() if line.startswith("sharding:")]
    if code != 0 or len(lines) != 1:
        raise RuntimeError(f"clustersim {' '.join(argv)}: exit {code}: {err.strip()}")
    return "```\n$ clustersim " + " ".join(argv) + "\n" + lines[0] + "\n```"


def _typo_fabric() -> str:
    """A node-link JSON graph of one p5.48xlarge's GPUs on a switch whose first edge
    misspells ``capacity_Bps``: one node or edge a line."""
    nodes = [f'    {{"id": "gpu{i}", "instance": 0}},' for i in range(8)]
    nodes.append('    {"id": "nvswitch"}')
    edges = [
        f'    {{"source": "gpu{i}", "target": "nvswitch", '
        f'"{"capacity_bps" if i == 0 else "capacity_Bps"}": "450GB/s", "latency_s": "1us"}}'
        for i in range(8)
    ]
    head = ["{", '  "directed": false,', '  "nodes": [', *nodes, "  ],", '  "links": [']
    return "\n".join([*head, ",\n".join(edges), "  ]", "}"])


FABRIC_ERROR = ("p5-llama3-8b", "my-fabric.json")
"""The custom-fabric how-to's bad graph: the scenario it is checked with, its file."""


def fabric_error(ctx: object = None) -> str:
    """``clustersim check`` of a shipped scenario on a graph with a misspelled edge
    attribute (:func:`_typo_fabric`), run in a temporary folder: the file, as a titled
    block, and the command with the error it prints."""
    del ctx
    scenario, name = FABRIC_ERROR
    text = _typo_fabric()
    argv = ["check", f"scenarios/{scenario}.yaml", "--set", f"cluster.fabric_file={name}"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "scenarios").mkdir()
        (root / "scenarios" / f"{scenario}.yaml").write_bytes(
            (SCENARIOS / f"{scenario}.yaml").read_bytes()
        )
        (root / name).write_text(text + "\n", "utf-8")
        code, _, err = clustersim_command(argv, root)
    if code != 2 or not err.startswith("clustersim: error:"):
        raise RuntimeError(f"clustersim {' '.join(argv)}: exit {code}, not a bad-input error")
    return (
        f'```json title="{name}"\n{text}\n```\n\n'
        f"```\n$ clustersim {' '.join(argv)}\n{err.strip()}\n```"
    )


def sharp_example(ctx: object = None, scenario: str = "dgx-h100-llama3-70b-sharp") -> str:
    """The in-network reduction example run with the fabric's SHARP on and off, and a
    1 GiB all-reduce over four of its nodes each way (a Markdown table)."""
    del ctx
    from clustersim.network.microbench import run_collective
    from clustersim.scenario import load_scenario
    from clustersim.sim import simulate

    out = [
        "| SHARP | step time | exposed comm | MFU | all-reduce, 1 GiB over 4 nodes |",
        "|---|---|---|---|---|",
    ]
    base = 0.0
    for on in (True, False):
        res = load_scenario(SCENARIOS / f"{scenario}.yaml", [f"cluster.efa.sharp={on}"])
        s = simulate(res, record=False).summary
        step = float(s["step_time_s"])
        base = base or step
        (row,) = run_collective(res.instance.name, 4, "all_reduce", [2.0**30], efa={"sharp": on})
        delta = "" if on else f" ({step / base - 1:+.1%})"
        out.append(
            f"| {'on' if on else 'off'} | {step:.3f} s{delta} | "
            f"{s['breakdown_s']['exposed_comm']:.3f} s | {s['mfu']:.1%} | "
            f"{row['time_s'] * 1e3:.2f} ms, {row['busbw_GBps']:.0f} GB/s busbw "
            f"({row['algorithm']}) |"
        )
    return "\n".join(out)


def chakra_round_trip(scenario: str, sets: tuple[str, ...] = ()) -> tuple[float, float, int]:
    """``scenario`` (with ``sets``) simulated as built, every rank in detail, then exported
    as Chakra traces and run from them on the same cluster: the two step times (s) and
    the traces' nodes.

    The imported scenario keeps what a trace workload reads besides the traces: the
    cluster, ``training.steps`` and injected failures. A long-horizon failure study
    (a preset over days) is left out of both runs: it needs a model and a layout, and
    the step it starts from is what the round trip compares."""
    from clustersim.scenario import load_scenario, resolve
    from clustersim.sim import simulate
    from clustersim.sim.chakra_export import export_chakra
    from clustersim.sim.run import compile_programs, plan

    res = load_scenario(SCENARIOS / f"{scenario}.yaml", list(sets))
    failures = res.raw.get("failures") or {}
    if failures and not failures.get("inject"):  # a long-horizon study: its step alone
        res = resolve({k: v for k, v in res.raw.items() if k != "failures"})
        failures = {}
    # Every rank simulated, as a trace runs: a folded run (the default for large
    # clusters) differs from that by its own error, not the round trip's.
    built = simulate(res, record=False, fidelity="detailed").summary
    with tempfile.TemporaryDirectory() as tmp:
        pl = plan(res)
        done = export_chakra(pl, compile_programs(pl), Path(tmp), "t")
        data: dict[str, Any] = {
            "name": f"{scenario}-trace",
            "cluster": res.raw["cluster"],
            "workload": {"chakra": str(Path(tmp) / "t")},
            "training": {"steps": res.scenario.training.steps},
        }
        if failures.get("inject"):
            data["failures"] = failures
        imported = simulate(resolve(data), record=False).summary
    return float(built["step_time_s"]), float(imported["step_time_s"]), done.nodes


ROUND_TRIPS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("p5-llama3-8b", ("model.layers=4",), "4 layers"),
    ("trn2-llama3-8b", ("model.layers=2",), "2 layers"),
    ("mbridge-llama3-8b-fsdp", ("model.layers=4",), "4 layers"),
    (
        "p5-qwen3-30b-a3b",
        ("model.layers=8", "parallelism.virtual_stages=4", "training.global_batch_size=64"),
        "8 layers, 4 virtual stages, 8 microbatches",
    ),
    ("trn2-ultraserver-llama3-70b-fsdp", ("model.layers=4",), "4 layers"),
    (
        "trn2-ultraserver-llama3-70b",
        ("model.layers=4", "training.global_batch_size=32"),
        "4 layers, 8 microbatches",
    ),
    (
        "trn2-ultraserver-custom-fabric",
        ("model.layers=4", "training.global_batch_size=32"),
        "4 layers, 8 microbatches",
    ),
    ("trn2-ultraserver-lane-loss", (), "as shipped: 4 layers, its lane lost, 2 steps"),
    (
        "trn2-ultraserver-mixtral-8x7b",
        ("model.layers=4", "training.global_batch_size=128"),
        "4 layers, 8 microbatches",
    ),
    (
        "trn2-multi-ultraserver-llama3-70b",
        ("model.layers=4", "training.global_batch_size=32"),
        "4 layers, 4 microbatches",
    ),
    (
        "trn1-llama2-7b",
        ("model.layers=2", "cluster.count=2", "parallelism.dp=8", "training.global_batch_size=64"),
        "2 layers, 2 instances (dp 8), 8 microbatches",
    ),
    (
        "dgx-h100-llama3-70b-sharp",
        ("model.layers=4", "cluster.count=16", "training.global_batch_size=16"),
        "4 layers, 16 nodes (dp 4), 4 microbatches",
    ),
    (
        "trn3-ultraserver-llama3-405b",
        ("model.layers=9", "training.global_batch_size=16"),
        "9 layers, 4 microbatches",
    ),
    (
        "trn2-ultracluster-deepseek-v3",
        ("cluster.count=4", "parallelism.pp=4", "model.layers=8", "training.global_batch_size=16"),
        "8 layers, 4 instances (pp 4, dp 4), 4 microbatches",
    ),
    (
        "llama3-16k-54days",
        ("cluster.count=32", "model.layers=16", "training.global_batch_size=16"),
        "16 layers, 32 instances (dp 2), 8 microbatches; no failure study",
    ),
    (
        "checkpoint-interval-study",
        ("cluster.count=4", "model.layers=16", "training.global_batch_size=16"),
        "16 layers, 4 instances (dp 2), 8 microbatches; no failure study",
    ),
)
"""The shipped training examples the round-trip table runs: ``(scenario, --set values,
what was run)``. Each is cut (fewer layers and microbatches; the large clusters fewer
instances, so fewer data-parallel replicas) to run in seconds, and keeps its parallel
layout's other dimensions, its fabric and its failures."""


def chakra_round_trips(ctx: object = None) -> str:
    """Each example of :data:`ROUND_TRIPS` built, exported and imported: step times
    and their difference (a Markdown table and the largest difference). The rows run
    in parallel, one process per CPU this process may use."""
    del ctx
    from concurrent.futures import ProcessPoolExecutor

    out = [
        "| example | run as | built | imported | difference |",
        "|---|---|---:|---:|---:|",
    ]
    worst = 0.0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    names, sets = [r[0] for r in ROUND_TRIPS], [r[1] for r in ROUND_TRIPS]
    with ProcessPoolExecutor(min(cpus or 1, len(names))) as pool:  # the rows are independent
        times = list(pool.map(chakra_round_trip, names, sets))
    for (scenario, _, what), (built, imported, _) in zip(ROUND_TRIPS, times, strict=True):
        diff = imported / built - 1
        worst = max(worst, abs(diff))
        out.append(
            f"| `{scenario}` | {what} | {built * 1e3:,.3f} ms | {imported * 1e3:,.3f} ms "
            f"| {diff:+.3%} |"
        )
    out += ["", f"The largest difference is {worst:.3%}."]
    return "\n".join(out)


CHAKRA_EXAMPLE = ("p5-llama3-8b", ("model.layers=4",), "p5-llama3-8b-trace")
"""The how-to's worked example: the scenario exported, its ``--set`` values, and the
name of the trace scenario that runs the files (the page's ``p5-llama3-8b-trace.yaml``)."""


def chakra_example(ctx: object = None) -> str:
    """What ``clustersim export chakra`` and then ``clustersim run`` of the traces print
    for the how-to's worked example (no wall time or output directory), fenced as the
    page quotes it, with the commands."""
    del ctx
    import yaml

    from clustersim.scenario import load_scenario
    from clustersim.sim import simulate
    from clustersim.sim.chakra_command import export_command, trace_table
    from clustersim.terminal import table_text

    scenario, sets, name = CHAKRA_EXAMPLE
    res = load_scenario(SCENARIOS / f"{scenario}.yaml", list(sets))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        wrote = export_command(res, root / "traces", None)
        data = {
            "name": name,
            "cluster": res.raw["cluster"],
            "workload": {"chakra": {"prefix": f"traces/{scenario}"}},
            "training": {"steps": 1},
        }
        (root / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False), "utf-8")
        summary = simulate(load_scenario(root / f"{name}.yaml"), record=False).summary
    summary["workload"]["chakra"] = data["workload"]["chakra"]["prefix"]  # as run beside it
    shown = " ".join(f"--set {s}" for s in sets)
    lines = [
        f"$ clustersim export chakra scenarios/{scenario}.yaml --out traces {shown}",
        wrote.replace(f"{root}/", ""),
        f"$ clustersim run {name}.yaml",
        table_text(trace_table(summary)),
    ]
    return "```\n" + "\n".join(lines) + "\n```"


BLOCKS: tuple[tuple[str, Callable[..., str], float, str, tuple[str, ...]], ...] = (
    (
        "sharding-check",
        sharding_check,
        0.0,
        "the sharding line `clustersim check` prints for a hybrid-sharded example",
        ("docs/explanation/sharding.md",),
    ),
    (
        "custom-fabric-error",
        fabric_error,
        0.0,
        "`clustersim check` on a graph with a misspelled edge attribute",
        ("docs/how-to/custom-fabric.md",),
    ),
    (
        "sharp-example",
        sharp_example,
        0.01,
        "the in-network reduction example with SHARP on and off",
        ("docs/explanation/collectives.md",),
    ),
    (
        "chakra-round-trips",
        chakra_round_trips,
        0.01,
        "shipped examples exported as Chakra traces and imported back: step times",
        ("docs/how-to/chakra.md",),
    ),
    (
        "chakra-example",
        chakra_example,
        0.01,
        "what `clustersim export chakra` and `clustersim run` of its traces print for the "
        "Chakra how-to's example (no wall time or output directory)",
        ("docs/how-to/chakra.md",),
    ),
)
