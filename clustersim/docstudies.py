"""Studies the documentation quotes that run the layout search or whole-model steps: the
layout-search tutorial's output and its pick against the shipped layout, the sharding
page's layouts, the custom-fabric how-to's tables, and the Chakra how-to's load time.

Each entry of :data:`FIGURES` is ``(name, pattern, compute, noise, what, pages)``, a
figure of ``python -m clustersim.docs`` (a block where ``pattern`` is empty). The runs
are computed once per process and shared between the figures that quote them: the
search once for its output, its wall times and its pick.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clustersim.search.run import SearchResult
    from clustersim.sim.run import Fidelity

__all__ = [
    "ESTIMATE_CASES",
    "FABRIC_SETS",
    "FIGURES",
    "SEARCH",
    "SEARCH_EXAMPLES",
    "chakra_load_cpu",
    "estimate_ratios",
    "fabric_all_reduce",
    "fabric_export",
    "fabric_steps",
    "fold_zero_events",
    "interference",
    "layout_search",
    "layout_search_output",
    "layouts_table",
    "search_examples",
    "search_wall",
]

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
SEARCH = ("trn2-ultraserver-llama3-70b", 64, "cost", 5)
"""The tutorial's search: ``(scenario, --chips, --objective, layouts shown)``."""


@functools.cache
def _summary(
    scenario: str, sets: tuple[str, ...] = (), fidelity: Fidelity = "auto"
) -> dict[str, Any]:
    """A shipped scenario's summary (``record=False``), once per process."""
    from clustersim.scenario import load_scenario
    from clustersim.sim import simulate

    res = load_scenario(SCENARIOS / f"{scenario}.yaml", list(sets))
    return simulate(res, record=False, fidelity=fidelity).summary


@functools.lru_cache(maxsize=1)
def layout_search() -> SearchResult:
    """The tutorial's search (:data:`SEARCH`), once per process."""
    from clustersim.scenario import load_scenario
    from clustersim.search.run import search

    scenario, chips, objective, _ = SEARCH
    res = load_scenario(SCENARIOS / f"{scenario}.yaml")
    return search(res, chips=chips, objective=objective, simulate=5)


_WALL = re.compile(r" \(estimates in [0-9.]+ s, search in [0-9.]+ s\)")


def layout_search_output(ctx: object = None) -> str:
    """What ``clustersim search`` prints for the tutorial's search, fenced as the page
    quotes it: its wall times (quoted apart, :func:`search_wall`) and the paths of its
    files left out."""
    del ctx
    import io

    from rich.console import Console

    from clustersim.search.present import counts_line, search_table

    scenario, chips, objective, shown = SEARCH
    result = layout_search()
    buf = io.StringIO()  # as the terminal shows it, blank lines kept
    Console(file=buf, width=200, color_system=None, soft_wrap=False).print(
        search_table(result, shown)
    )
    lines = [
        f"$ clustersim search scenarios/{scenario}.yaml --chips {chips} --objective {objective}",
        _WALL.sub("", counts_line(result)),
        "\n".join(line.rstrip() for line in buf.getvalue().strip("\n").splitlines()),
    ]
    return "```\n" + "\n".join(lines) + "\n```"


def search_wall(part: str) -> Callable[[object], str]:
    """The wall time of the search's estimates (``part="estimates"``) or of all of it."""

    def compute(ctx: object = None) -> str:
        result = layout_search()
        return f"{result.estimate_s if part == 'estimates' else result.wall_s:.1f} s"

    return compute


def _pick_sets() -> tuple[str, ...]:
    """The search's best layout as ``--set`` values on its scenario."""
    result = layout_search()
    best = result.top(1).to_dict(orient="records")[0]
    keys = ("tp", "pp", "cp", "zero", "dp_shard", "microbatch_size", "recompute", "schedule")
    return (
        f"cluster.count={result.instances}",
        *(f"parallelism.{k}={best[k]}" for k in keys),
    )


def _layout(lay: dict[str, Any], shard: int) -> str:
    """``TP 2 x CP 8 x FSDP 16, no recompute`` for a summary's layout."""
    dims = [f"{k.upper()} {lay[k]}" for k in ("tp", "pp", "cp") if k == "tp" or lay[k] > 1]
    if lay["zero"] == 3 and shard == lay["dp"]:
        dims.append(f"FSDP {shard}")
    elif lay["zero"] == 3:
        dims.append(f"HSDP {shard} x {lay['dp'] // shard}")
    else:
        dims.append(f"DP {lay['dp']}" + (f", ZeRO-{lay['zero']}" if lay["zero"] else ""))
    recompute = {"none": "no recompute", "selective": "selective recompute"}
    return " x ".join(dims) + f", {recompute.get(lay['recompute'], 'full recompute')}"


def _layouts() -> dict[str, tuple[str, dict[str, Any]]]:
    """The shipped 70B layout, the FSDP example and the search's pick: a label and the
    summary of each, simulated folded as the search simulates its candidates."""
    scenario = SEARCH[0]
    shipped = _summary(scenario, (), "folded")
    fsdp = _summary(f"{scenario}-fsdp", (), "folded")
    sets = _pick_sets()
    pick = _summary(scenario, sets, "folded")
    shard = int(next(s for s in sets if ".dp_shard=" in s).rsplit("=", 1)[1])
    return {
        "shipped": (f"{_layout(shipped['layout'], shipped['layout']['dp'])} (shipped)", shipped),
        "fsdp": (f"{_layout(fsdp['layout'], fsdp['layout']['dp'])} (FSDP example)", fsdp),
        "pick": (f"{_layout(pick['layout'], shard)} (search's pick)", pick),
    }


def layouts_table(*rows: str) -> Callable[[object], str]:
    """The layouts ``rows`` of :func:`_layouts` as a Markdown table, each against the
    shipped one."""

    def compute(ctx: object = None) -> str:
        layouts = _layouts()
        base = layouts["shipped"][1]["step_time_s"]
        out = [
            "| layout | step s | against shipped | MFU | memory GiB/chip | $/M tokens "
            "| compute s | exposed comm s | bubble s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for key in rows:
            label, s = layouts[key]
            step, parts = s["step_time_s"], s["breakdown_s"]
            vs = "" if key == "shipped" else f"{step / base - 1:+.0%}"
            out.append(
                f"| {label} | {step:.2f} | {vs} | {s['mfu']:.1%} | "
                f"{s['memory_gib_per_chip']['total']:.1f} | "
                f"{s['cost']['usd_per_million_tokens']:.3f} | {parts['compute']:.2f} | "
                f"{parts['exposed_comm']:.2f} | {parts['bubble']:.2f} |"
            )
        return "\n".join(out)

    return compute


SEARCH_EXAMPLES = (("trn2-llama3-8b", 16), ("p5-llama3-8b", 8))
"""The tutorial's other searches: ``(scenario, --chips)``, the default objective (time)
and five layouts simulated."""


def search_examples(ctx: object = None) -> str:
    """The three best simulated layouts of each of :data:`SEARCH_EXAMPLES`, each against
    its search's best (a Markdown table)."""
    del ctx
    from clustersim.scenario import load_scenario
    from clustersim.search.run import search

    out = [
        "| example | # | layout | microbatch | simulated step s | against the best |",
        "|---|---|---|---|---|---|",
    ]
    for scenario, chips in SEARCH_EXAMPLES:
        result = search(load_scenario(SCENARIOS / f"{scenario}.yaml"), chips=chips)
        records = result.top(3).to_dict(orient="records")
        rows = [{str(k): v for k, v in r.items()} for r in records]
        best = rows[0]["sim_step_time_s"]
        for i, r in enumerate(rows, 1):
            shown = f"`{scenario}`, {chips} chips" if i == 1 else ""
            vs = "" if i == 1 else f"{r['sim_step_time_s'] / best - 1:+.1%}"
            out.append(
                f"| {shown} | {i} | {_layout(r, int(r['dp_shard']))} | {r['microbatch_size']} | "
                f"{r['sim_step_time_s']:.3f} | {vs} |"
            )
    return "\n".join(out)


ESTIMATE_CASES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    *(
        (name, ("failures={}", "training.steps=1"), "as shipped, healthy")
        for name in (
            "trn2-llama3-8b",
            "p5-llama3-8b",
            "trn1-llama2-7b",
            "mbridge-llama3-8b-fsdp",
            "trn2-ultraserver-lane-loss",
        )
    ),
    ("p5-llama3-8b", ("parallelism.zero=3", "training.global_batch_size=16"), "ZeRO-3"),
    (
        "p5-llama3-8b",
        ("parallelism.zero=2", "parallelism.dp_shard=2", "training.global_batch_size=16"),
        "ZeRO-2, HSDP over pairs",
    ),
    ("trn2-llama3-8b", ("parallelism.zero=3", "training.global_batch_size=16"), "ZeRO-3"),
    (
        "trn2-llama3-8b",
        (
            "parallelism.zero=3",
            "parallelism.pp=2",
            "parallelism.fsdp.reshard_after_forward=false",
            "training.global_batch_size=16",
        ),
        "ZeRO-3, PP 2, units kept gathered",
    ),
    (
        "trn2-ultraserver-llama3-70b",
        (
            "parallelism.tp=16",
            "parallelism.pp=1",
            "parallelism.zero=3",
            "parallelism.recompute=none",
        ),
        "TP 16 x FSDP 16, no recompute",
    ),
)
"""The estimate-against-simulation table's runs: ``(scenario, --set values, what was
run)``. The shipped examples run as ``tests/search/test_estimate_agrees.py`` runs them;
the sharded Llama-3-8B layouts as ``tests/search/test_sharded_estimate.py`` does (16
sequences a step, every rank simulated)."""


def estimate_ratios(ctx: object = None) -> str:
    """Each of :data:`ESTIMATE_CASES` estimated (``search.estimate``) and simulated: both
    step times and their ratio (a Markdown table)."""
    del ctx
    from clustersim.scenario import load_scenario
    from clustersim.search.estimate import estimate_resolved

    out = [
        "| example | run as | estimate s | simulated s | estimate / simulated |",
        "|---|---|---:|---:|---:|",
    ]
    for scenario, sets, what in ESTIMATE_CASES:
        res = load_scenario(SCENARIOS / f"{scenario}.yaml", list(sets))
        sharded = any(s.startswith("parallelism.zero=") for s in sets)
        fidelity: Fidelity = "detailed" if sharded and "8b" in scenario else "auto"
        est = estimate_resolved(res).step_time_s
        sim = float(_summary(scenario, sets, fidelity)["step_time_s"])
        out.append(f"| `{scenario}` | {what} | {est:.3f} | {sim:.3f} | {est / sim:.3f} |")
    return "\n".join(out)


FABRIC = ("trn2-ultraserver-llama3-70b", "trn2-ultraserver-custom-fabric")
FABRIC_FILE = SCENARIOS / "fabrics" / "trn2-ultraserver-missing-z.graphml"
FABRIC_SETS = ("model.layers=8", "training.global_batch_size=32")
"""The custom-fabric step table's cut: 8 layers and half the batch, to run in seconds."""
FABRIC_LAYOUTS = (
    ("shipped: TP 16 in an instance row, DP 4 in the instance, PP 4 across the instances", ()),
    (
        "`--set parallelism.pp=1 --set parallelism.recompute=full`: DP 16 along the Z rings",
        ("parallelism.pp=1", "parallelism.recompute=full"),
    ),
)


def fabric_all_reduce(ctx: object = None) -> str:
    """``clustersim collective`` of a 64-chip all-reduce on the built UltraServer and on
    the one missing Z links, side by side, fenced as the page quotes it."""
    del ctx
    from clustersim.network.microbench import run_collective
    from clustersim.units import format_bytes

    sizes = [2.0**20, 64 * 2.0**20, 2.0**30]
    built = run_collective("trn2u.48xlarge", 4, "all_reduce", sizes)
    cut = run_collective("trn2u.48xlarge", 4, "all_reduce", sizes, fabric_file=str(FABRIC_FILE))
    out = [
        "    size   built: time (us)   busbw (GB/s)   missing Z: time (us)   busbw (GB/s)"
        "   algorithm"
    ]
    for a, b in zip(built, cut, strict=True):
        algorithm = (
            a["algorithm"]
            if a["algorithm"] == b["algorithm"]
            else (f"{a['algorithm']} / {b['algorithm']}")
        )
        out.append(
            f"{format_bytes(a['size_bytes']):>8}{a['time_s'] * 1e6:>19.1f}{a['busbw_GBps']:>15.2f}"
            f"{b['time_s'] * 1e6:>23.1f}{b['busbw_GBps']:>15.2f}   {algorithm}"
        )
    return "```\n" + "\n".join(out) + "\n```"


def fabric_export(ctx: object = None) -> str:
    """What ``clustersim topology export`` prints for the shipped 70B UltraServer, fenced
    with its command as the page quotes it."""
    del ctx
    import argparse
    import contextlib
    import io
    import tempfile

    from clustersim.sim.fabric_command import topology_command

    scenario = f"scenarios/{FABRIC[0]}.yaml"
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()) as out:
        args = argparse.Namespace(
            topology_command="export",
            scenario=ROOT / scenario,
            sets=[],
            out=Path(tmp) / "fabric.graphml",
            format=None,
        )
        topology_command(args)
        printed = out.getvalue().replace(f"{tmp}/", "")
    command = f"$ clustersim topology export {scenario} --out fabric.graphml"
    return "```\n" + command + "\n" + printed.rstrip("\n") + "\n```"


def _delta(seconds: float) -> str:
    return f"{seconds * 1e6:+.0f} us" if abs(seconds) < 1e-3 else f"{seconds * 1e3:+.2f} ms"


def fabric_steps(ctx: object = None) -> str:
    """One step of each :data:`FABRIC_LAYOUTS` (cut by :data:`FABRIC_SETS`) on the built
    fabric and on the one missing Z links, detailed (an imported graph does not fold)."""
    del ctx
    out = [
        "| layout | built fabric | missing Z links | cost | exposed comm |",
        "|---|---|---|---|---|",
    ]
    for label, sets in FABRIC_LAYOUTS:
        built, cut = (_summary(s, (*FABRIC_SETS, *sets), "detailed") for s in FABRIC)
        a, b = built["step_time_s"], cut["step_time_s"]
        ea, eb = (s["breakdown_s"]["exposed_comm"] for s in (built, cut))
        out.append(
            f"| {label} | {a:.6f} s | {b:.6f} s | {_delta(b - a)} ({b / a - 1:+.3%}) | "
            f"{ea:.4f} -> {eb:.4f} s |"
        )
    return "\n".join(out)


def chakra_load_cpu(ctx: object = None) -> str:
    """CPU seconds to load ``clustersim bench --only chakra-load``'s 200,000-node trace."""
    del ctx
    from clustersim.bench.chakra import chakra_load

    return f"{chakra_load(lambda _: None)['load_cpu_s']:.1f}"


def fold_zero_events(ctx: object = None) -> str:
    """Events of the folded 16K-chip bench case (``clustersim bench``'s ``fold-16k``) as
    benched (``zero: 1``) and with ``zero: 3`` (a Markdown table)."""
    del ctx
    import tempfile

    from clustersim.bench.cases import FOLD_CHIPS, fold_scenario
    from clustersim.scenario import load_scenario
    from clustersim.sim import simulate

    out = ["| fold-16k | events | fidelity |", "|---|---:|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fold-16k.yaml"
        path.write_text(fold_scenario(FOLD_CHIPS["fold-16k"]), "utf-8")
        for zero, what in ((1, "`zero: 1` (as benched)"), (3, "`zero: 3`")):
            s = simulate(load_scenario(path, [f"parallelism.zero={zero}"]), record=False).summary
            out.append(f"| {what} | {s['events']:,} | {s['fidelity']} |")
    return "\n".join(out)


def interference(scenario: str, what: str) -> Callable[[object], str]:
    """The compute time a shipped scenario's step loses to the collectives beside it
    (``what="time"``, in ms) or its share of the step (``what="share"``)."""

    def compute(ctx: object = None) -> str:
        s = _summary(scenario)
        lost = s["breakdown_s"]["interference"]
        return f"{lost * 1e3:.2f} ms" if what == "time" else f"{lost / s['step_time_s']:.2%}"

    return compute


_TUTORIAL = "docs/tutorials/layout-search.md"
_WALL_NOISE = 4.0  # a shared machine's load moves wall times several-fold: only 5x is stale
FIGURES: tuple[tuple[str, str, Callable[..., str], float, str, tuple[str, ...]], ...] = (
    ("layout-search-output", "", layout_search_output, 0.0,
     "what `clustersim search` prints for the tutorial's 70B search (no wall times or "
     "file paths)", (_TUTORIAL,)),
    ("layout-search-estimates-wall", r"estimates in ([0-9.]+ s)", search_wall("estimates"),
     _WALL_NOISE, "wall time of the tutorial search's estimates", (_TUTORIAL,)),
    ("layout-search-wall", r"search in ([0-9.]+ s)", search_wall("search"), _WALL_NOISE,
     "wall time of the tutorial's whole search", (_TUTORIAL,)),
    ("estimate-ratios", "", estimate_ratios, 0.0,
     "the search's estimate against the simulated step on the shipped examples and "
     "sharded layouts", (_TUTORIAL,)),
    ("search-examples", "", search_examples, 0.0,
     "the best simulated layouts of the searches on the 8B examples", (_TUTORIAL,)),
    ("layout-search-pick", "", layouts_table("shipped", "pick"), 0.0,
     "the search's pick against the shipped layout, both simulated folded", (_TUTORIAL,)),
    ("sharding-layouts", "", layouts_table("shipped", "fsdp", "pick"), 0.0,
     "the shipped 70B layout, the FSDP example and the search's pick, simulated folded",
     ("docs/explanation/sharding.md",)),
    ("fold-zero-events", "", fold_zero_events, 0.0,
     "the events of the folded 16K-chip bench case with ZeRO-1 and ZeRO-3",
     ("docs/explanation/sharding.md",)),
    ("custom-fabric-export", "", fabric_export, 0.0,
     "what `clustersim topology export` prints for the shipped 70B UltraServer",
     ("docs/how-to/custom-fabric.md",)),
    ("custom-fabric-all-reduce", "", fabric_all_reduce, 0.0,
     "a 64-chip all-reduce on the built UltraServer and on the one missing Z links",
     ("docs/how-to/custom-fabric.md",)),
    ("custom-fabric-steps", "", fabric_steps, 0.0,
     "a step of the 70B layouts, cut to 8 layers, on each fabric (detailed)",
     ("docs/how-to/custom-fabric.md",)),
    ("p5-interference", r"\(`scenarios/p5-llama3-8b.yaml`\) ([0-9.]+ ms) \(",
     interference("p5-llama3-8b", "time"), 0.0,
     "the compute time Llama-3-8B on a p5.48xlarge loses to its collectives",
     ("docs/explanation/chips.md",)),
    ("p5-interference-share", r"p5-llama3-8b.yaml`\) [0-9.]+ ms \(([0-9.]+%) of the step",
     interference("p5-llama3-8b", "share"), 0.0, "its share of the step",
     ("docs/explanation/chips.md",)),
    ("chakra-load-cpu", r"in about ([0-9.]+) CPU seconds", chakra_load_cpu, _WALL_NOISE,
     "CPU time to load a 200,000-node Chakra trace (chakra-load): it moves with the "
     "machine's load, as wall times do", ("docs/how-to/chakra.md",)),
)  # fmt: skip
