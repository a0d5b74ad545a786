"""Command-line interface: parsing and printing only; no simulation logic here.

Exit codes: 0 ok, 2 bad input (one line on stderr naming the key path and the
value), 1 internal error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from clustersim import __version__, catalog
from clustersim.errors import ClusterSimError, ScenarioError

__all__ = ["main"]

PROGRESS_DELAY_S = 2.0


def _slug(name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return slug[:80] or "scenario"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="clustersim",
        description="Discrete-event simulator of AI-training clusters (Trainium and GPUs).",
    )
    p.add_argument("--version", action="version", version=f"clustersim {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="simulate a scenario and write summary, trace and report")
    run.add_argument("scenario", type=Path, help="scenario YAML file")
    run.add_argument("--out", type=Path, help="output directory (default reports/<name>/)")
    run.add_argument(
        "--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
        help="override a scenario key, e.g. --set parallelism.tp=4 (repeatable)",
    )  # fmt: skip
    run.add_argument("--seed", type=int, help="random seed (overrides the scenario's)")
    run.add_argument("--quiet", action="store_true", help="print nothing on success")
    run.add_argument("--json", action="store_true", help="print summary.json to stdout")

    check = sub.add_parser("check", help="validate a scenario; print layout, placement, memory")
    check.add_argument("scenario", type=Path)
    check.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")

    cat = sub.add_parser("catalog", help="list or show catalog entries")
    cat.add_argument("kind", nargs="?", choices=catalog.KINDS)
    cat.add_argument("name", nargs="?")

    sub.add_parser("schema", help="print the JSON Schema of scenario files")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = _COMMANDS[args.command]
    try:
        return handler(args)
    except ClusterSimError as exc:
        print(f"clustersim: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("clustersim: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not bad input: say so, keep the details reachable
        if os.environ.get("CLUSTERSIM_DEBUG"):
            traceback.print_exc()
        print(
            f"clustersim: internal error: {type(exc).__name__}: {exc} "
            "(set CLUSTERSIM_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return 1


# -- run ------------------------------------------------------------------------------


class _LazyProgress:
    """A rich progress bar that appears only once a run has taken PROGRESS_DELAY_S."""

    def __init__(self, console: Console, label: str) -> None:
        self.console, self.label = console, label
        self.t0 = time.perf_counter()
        self._bar: Any = None
        self._task: Any = None

    def __call__(self, fraction: float) -> None:
        if self._bar is None:
            if time.perf_counter() - self.t0 < PROGRESS_DELAY_S:
                return
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.percentage:>3.0f}%"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=1.0)
        self._bar.update(self._task, completed=min(fraction, 1.0))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _run(args: argparse.Namespace) -> int:
    from clustersim.scenario import load_scenario
    from clustersim.sim import simulate
    from clustersim.trace import atomic_write_text, write_parquet

    res = load_scenario(args.scenario, args.sets, args.seed)
    sc = res.scenario
    out = args.out or Path(sc.output.dir or Path("reports") / _slug(sc.name))
    if out.exists() and not out.is_dir():
        raise ScenarioError("--out", str(out), "output path exists and is not a directory")
    err = Console(stderr=True)
    progress = None if (args.quiet or args.json) else _LazyProgress(err, f"simulating {sc.name}")
    try:
        result = simulate(res, progress=progress)
    finally:
        if progress is not None:
            progress.close()
    summary = result.summary
    out.mkdir(parents=True, exist_ok=True)
    # The summary is written last: its presence marks a complete result directory.
    (out / "summary.json").unlink(missing_ok=True)
    atomic_write_text(
        out / "resolved_scenario.yaml", yaml.safe_dump(res.as_dict(), sort_keys=False)
    )
    if sc.output.trace:
        write_parquet(out / "trace.parquet", result.trace_frame())
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, sort_keys=False) + "\n")
    if args.json:
        print(json.dumps(summary, indent=2))
    elif not args.quiet:
        Console().print(_summary_table(summary, out))
    return 0


def _summary_table(s: dict[str, Any], out: Path) -> Table:
    lay, mem, cost, step = s["layout"], s["memory_gib_per_chip"], s["cost"], s["step_time_s"]
    title = f"{s['scenario']}: {s['chips']} x {s['chip']} ({s['instances']} x {s['instance']})"
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("metric", style="bold")
    t.add_column("value", justify="right")
    t.add_column("note")
    layout = (
        f"tp {lay['tp']} pp {lay['pp']} dp {lay['dp']} cp {lay['cp']}, "
        f"{lay['microbatches']} microbatches, {lay['schedule']}, recompute {lay['recompute']}"
    )
    t.add_row("model", s["model"], layout)
    t.add_row("step time", f"{step:.3f} s", f"{s['tokens_per_step']:,} tokens per step")
    t.add_row("throughput", f"{s['tokens_per_s']:,.0f} tok/s", f"{s['sequences_per_s']:.2f} seq/s")
    t.add_row("MFU", f"{s['mfu']:.1%}", f"HFU {s['hfu']:.1%} (counts recompute)")
    for part, secs in s["breakdown_s"].items():
        t.add_row(f"  {part.replace('_', ' ')}", f"{secs:.3f} s", f"{secs / step:.1%} of step")
    parts = ", ".join(f"{k} {mem[k]:.1f}" for k in ("weights", "grads", "optimizer", "activations"))
    t.add_row(
        "memory per chip", f"{mem['total']:.1f} GiB", f"of {mem['capacity']:.0f} GiB: {parts}"
    )
    per_m = f"${cost['usd_per_million_tokens']:.3f} /M tok"
    t.add_row("cost", per_m, f"${cost['usd_per_hour']:,.2f}/h {cost['pricing']}")
    events = f"{s['events']:,} events, {s['events_per_s']:,.0f}/s"
    t.add_row("simulated in", f"{s['wall_s']:.2f} s", events)
    t.add_row("written to", str(out), "")
    return t


# -- check ----------------------------------------------------------------------------


def _check(args: argparse.Namespace) -> int:
    from clustersim.scenario import load_scenario
    from clustersim.sim import plan

    res = load_scenario(args.scenario, args.sets)
    pl = plan(res, check_memory=False)
    lay = pl.layout
    con = Console()
    cluster = (
        f"{res.scenario.cluster.count} x {res.instance.name} = {res.chips} {res.chip.name} chips"
    )
    ranks = f"lnc {res.lnc}: {res.ranks_per_chip} ranks per chip, {res.ranks} ranks"
    con.print(f"[bold]{res.scenario.name}[/]: {cluster}, {ranks}")
    con.print(
        f"layout: tp {lay.tp} x cp {lay.cp} x dp {lay.dp} x pp {lay.pp}; model {res.model.name}"
    )
    place = Table(title="rank placement (first groups)", title_justify="left")
    for col in ("group", "ranks", "chips"):
        place.add_column(col)
    for name in ("tp", "cp", "dp", "pp"):
        groups = lay.groups(name)
        if len(groups[0]) == 1:
            continue
        for g in groups[:2]:
            chips = sorted({lay.chip_of(r) for r in g})
            place.add_row(f"{name} ({len(groups)} groups)", _span(g), _span(chips))
    con.print(place)
    mem = Table(title="memory per chip (GiB), worst stage", title_justify="left")
    gib = pl.memory_gib_per_chip()
    for key in gib:
        mem.add_column(key, justify="right")
    mem.add_row(*(f"{v:.2f}" for v in gib.values()))
    con.print(mem)
    from clustersim.workload import check_fits

    sc = res.scenario
    check_fits(res.model, sc.parallelism, sc.training, lay, pl.chip.hbm_bytes_per_rank)
    con.print("[green]ok[/]: the scenario is valid and fits in HBM")
    return 0


def _span(values: Sequence[int]) -> str:
    vals = list(values)
    if len(vals) > 2 and vals == list(range(vals[0], vals[0] + len(vals))):
        return f"{vals[0]}..{vals[-1]}"
    shown = ", ".join(map(str, vals[:8]))
    return shown + (", ..." if len(vals) > 8 else "")


# -- catalog, schema ------------------------------------------------------------------


def _catalog(args: argparse.Namespace) -> int:
    con = Console()
    if args.kind is None:
        for kind in catalog.KINDS:
            con.print(f"[bold]{kind}[/]: {', '.join(catalog.names(kind))}")
        return 0
    if args.name is None:
        for name in catalog.names(args.kind):
            con.print(name)
        return 0
    loader = {"chips": catalog.chip, "instances": catalog.instance, "models": catalog.model}
    spec = loader[args.kind](args.name, None, f"catalog {args.kind}")
    con.print(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False), markup=False)
    return 0


def _schema(_args: argparse.Namespace) -> int:
    from clustersim.scenario import Scenario

    print(json.dumps(Scenario.model_json_schema(), indent=2))
    return 0


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _run,
    "check": _check,
    "catalog": _catalog,
    "schema": _schema,
}
