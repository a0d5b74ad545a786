"""Command-line interface: parsing and printing only; no simulation logic here.

Exit codes: 0 ok, 2 bad input (one line on stderr naming the key path and the
value), 1 internal error.

Each subcommand imports what it needs when it runs, so ``clustersim --help`` loads
nothing but argparse, and ``collective`` loads the network without the reliability
model, pandas or matplotlib (``tests/test_cli_imports.py`` holds it to that).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustersim.cli_args import build_parser
from clustersim.errors import ClusterSimError, ScenarioError
from clustersim.units import UnitError, parse_bytes

if TYPE_CHECKING:
    from rich.console import Console

    from clustersim.serve.run import ServeResult

__all__ = ["main"]

PROGRESS_DELAY_S = 2.0


def _with_chip_model(args: argparse.Namespace) -> list[str]:
    """``--set`` overrides, with ``--chip-model`` as the ``chip_model`` key."""
    sets = list(args.sets)
    if getattr(args, "chip_model", None):
        sets.append(f"chip_model={args.chip_model}")
    return sets


def _slug(name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return slug[:80] or "scenario"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = _COMMANDS[args.command]
    try:
        return handler(args)
    except ClusterSimError as exc:
        print(f"clustersim: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("clustersim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `clustersim ... | head`: the reader has all it wants
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the flush at exit does not fail again
        return 141  # 128 + SIGPIPE, as a command killed by the signal exits
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
        from clustersim.progress import Bar

        self.bar = Bar(console, label, delay_s=PROGRESS_DELAY_S, percent=True)

    def __call__(self, fraction: float) -> None:
        self.bar.update(min(fraction, 1.0), 1.0)

    def close(self) -> None:
        self.bar.close()


def _run(args: argparse.Namespace) -> int:
    import yaml

    from clustersim.scenario import load_scenario
    from clustersim.sim import Limits, simulate
    from clustersim.sim.injected import injection_frame
    from clustersim.terminal import console
    from clustersim.trace import LINK_TABLE, atomic_write_text, write_link_table, write_parquet

    res = load_scenario(args.scenario, _with_chip_model(args), args.seed)
    sc = res.scenario
    res.require_training("run")
    out = args.out or Path(sc.output.dir or Path("reports") / _slug(sc.name))
    _check_out(out, sc.name, force=args.force)
    try:
        limits = Limits(max_events=args.max_events, max_memory_bytes=parse_bytes(args.max_memory))
    except UnitError as exc:
        raise ScenarioError("--max-memory", args.max_memory, str(exc)) from None
    err = console(stderr=True)
    progress = None if (args.quiet or args.json) else _LazyProgress(err, f"simulating {sc.name}")
    try:
        result = simulate(res, progress=progress, limits=limits, fidelity=args.fidelity)
    finally:
        if progress is not None:
            progress.close()
    summary = result.summary
    warning = (summary.get("memory_check") or {}).get("warning")
    if warning:
        err.print(f"[yellow]warning[/]: {warning}")
    out.mkdir(parents=True, exist_ok=True)
    # The summary is written last: its presence marks a complete result directory.
    (out / "summary.json").unlink(missing_ok=True)
    resolved = res.as_dict()
    resolved_yaml = yaml.safe_dump(resolved, sort_keys=False)
    atomic_write_text(out / "resolved_scenario.yaml", resolved_yaml)
    frame = result.trace_frame() if sc.output.trace else None
    if frame is not None:
        write_parquet(out / "trace.parquet", frame)
    engines = result.engine_frame() if sc.output.trace else None
    if engines is not None:
        from clustersim.trace.engines import ENGINE_TABLE

        write_parquet(out / ENGINE_TABLE, engines)
    injections = injection_frame(summary)
    if injections is not None:
        write_parquet(out / "injections.parquet", injections)
    if result.reliability:
        from clustersim.failures import TIMELINE_FILE, timeline_frame
        from clustersim.trace.horizon import RELIABILITY_TRACE, write_reliability_trace

        timeline = timeline_frame(result.reliability)
        write_parquet(out / TIMELINE_FILE, timeline)
        write_reliability_trace(out / RELIABILITY_TRACE, timeline)
    links = result.link_table()
    write_link_table(out / LINK_TABLE, links)
    failed = summary.get("step_failed")
    if not args.no_report:
        from clustersim.report import RunData, write_report

        data = RunData(summary, resolved, resolved_yaml, frame, links=links, engines=engines)
        # A report page needs a finished step; the trace shows where the step failed.
        html = sc.output.html and not failed
        write_report(data, out, html=html, chrome=frame is not None)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, sort_keys=False) + "\n")
    if args.json:
        print(json.dumps(summary, indent=2))
    elif not args.quiet:
        con = console()
        if failed:
            con.print(
                f"{sc.name}: step {failed['step']} failed at {failed['at_s'] * 1e3:.3f} ms "
                f"({failed['cause']}); {summary['steps_completed']} steps completed; "
                f"summary, trace and injections written to {out}"
            )
        elif summary.get("workload") is not None:
            from clustersim.sim.chakra_command import trace_table

            con.print(trace_table(summary, out))
        else:
            from clustersim.terminal import summary_table

            con.print(summary_table(summary, str(out)))
        for line in _injection_notes(summary):
            con.print(line)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from clustersim.scenario import load_scenario
    from clustersim.serve.command import serve_command

    res = load_scenario(args.scenario, list(args.sets), args.seed)
    out = args.out or Path(res.scenario.output.dir or Path("reports") / _slug(res.scenario.name))
    _check_out(out, res.scenario.name, force=args.force)
    return serve_command(res, out, quiet=args.quiet, as_json=args.json, report=_serve_report)


def _serve_search(args: argparse.Namespace) -> int:
    from clustersim.report.serve_search import pareto_png
    from clustersim.serve.search_command import serve_search_command

    return serve_search_command(args, lambda result: pareto_png(result.frame, result.meta))


def _serve_report(result: ServeResult, out: Path, files: list[str], note: str) -> None:
    from clustersim.report.serving import ServeData, write_serving_report

    data = ServeData(result.summary, result.requests, result.iterations)
    write_serving_report(data, out, files=files, trace_note=note)


def _injection_notes(s: dict[str, Any]) -> list[str]:
    out = []
    for r in s.get("injections", []):
        factor = f" {r['factor']:g}" if r["factor"] is not None else ""
        when = "not reached" if r["applied_s"] is None else f"at {r['applied_s'] * 1e3:.3f} ms"
        effect = f": {r['effect']}" if r["effect"] else ""
        what = r["name"] if str(r["name"]).startswith(r["target"]) else f"{r['target']} {r['name']}"
        out.append(f"injected: {what} {r['kind']}{factor} {when}{effect}")
    refused = (s.get("fabric_file") or {}).get("fold_refused")
    if refused:
        out.append(f"not folded: {refused}; every rank was simulated")
    return out


def _check_out(out: Path, name: str, *, force: bool) -> None:
    """Refuse to mix one scenario's results with another's in the same directory."""
    import yaml

    if out.exists() and not out.is_dir():
        raise ScenarioError("--out", str(out), "output path exists and is not a directory")
    if force:
        return
    previous: Any = None
    for marker in ("summary.json", "resolved_scenario.yaml"):
        try:
            text = (out / marker).read_text("utf-8")
        except OSError:
            continue
        try:
            data = json.loads(text) if marker.endswith(".json") else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError):
            data = None
        previous = data.get("scenario", data.get("name")) if isinstance(data, dict) else None
        if previous is not None:
            break
    if previous is not None and previous != name:
        raise ScenarioError(
            "--out",
            str(out),
            f"holds the results of scenario {previous!r}, not {name!r}; "
            "choose another --out or pass --force",
        )


# -- check ----------------------------------------------------------------------------


def _check(args: argparse.Namespace) -> int:
    from clustersim.scenario import load_scenario
    from clustersim.sim.check_command import check_command
    from clustersim.terminal import console

    res = load_scenario(args.scenario, args.sets)
    if res.scenario.serving is not None:
        from clustersim.serve.run import check_serving

        console().print(check_serving(res))
        return 0
    return check_command(res)


# -- report ---------------------------------------------------------------------------


def _report(args: argparse.Namespace) -> int:
    from clustersim.report import load_run, write_comparison, write_report
    from clustersim.report.study import is_study_dir, write_study_report
    from clustersim.trace.chrome import DEFAULT_MAX_EVENTS, DEFAULT_MAX_RANKS

    if len(args.dirs) == 1 and is_study_dir(args.dirs[0]):  # a study of clustersim sweep
        out = args.out or args.dirs[0]
        written = write_study_report(args.dirs[0], out)
    elif len(args.dirs) == 1:
        data = load_run(args.dirs[0])
        out = args.out or args.dirs[0]
        written = write_report(
            data,
            out,
            chrome=not args.no_trace,
            max_trace_ranks=args.trace_ranks or DEFAULT_MAX_RANKS,
            max_trace_events=args.trace_events or DEFAULT_MAX_EVENTS,
        )
    else:
        runs = [load_run(d, trace=False) for d in args.dirs]  # all checked before writing
        out = args.out or Path("reports") / "comparison"
        written = write_comparison(runs, out)
    print(f"wrote {out / 'report.html'} and {len(written) - 1} more files")
    return 0


# -- catalog, schema ------------------------------------------------------------------


def _catalog(args: argparse.Namespace) -> int:
    from clustersim import catalog
    from clustersim.catalog import stacks
    from clustersim.terminal import print_yaml

    if args.kind is None:
        for kind in catalog.KINDS:
            print(f"{kind}: {', '.join(catalog.names(kind))}")
        print(f"stacks: {', '.join(stacks.stack_names())}")
        return 0
    if args.kind == "stacks":
        if args.name is None:
            print("\n".join(stacks.stack_lines()))
        else:
            print_yaml(stacks.describe_stack(args.name))
        return 0
    if args.name is None:
        for name in catalog.names(args.kind):
            print(name)
        return 0
    loader = {"chips": catalog.chip, "instances": catalog.instance, "models": catalog.model}
    spec = loader[args.kind](args.name, None, f"catalog {args.kind}")
    print_yaml(spec.model_dump(mode="json"))
    return 0


def _schema(_args: argparse.Namespace) -> int:
    from clustersim.catalog._strict import DocumentedSchema
    from clustersim.scenario import Scenario

    print(json.dumps(Scenario.model_json_schema(schema_generator=DocumentedSchema), indent=2))
    return 0


# -- collective -----------------------------------------------------------------------


def _collective(args: argparse.Namespace) -> int:
    from clustersim.errors import MISSING
    from clustersim.names import check
    from clustersim.network.collectives import OPS, algorithm_names
    from clustersim.network.microbench import collective_table, run_collective, size_sweep
    from clustersim.terminal import console
    from clustersim.units import UnitError, parse_bytes

    def parse(option: str, text: str, kind: Callable[[str], float]) -> float:
        try:
            return kind(text)
        except ValueError as exc:  # UnitError is one
            number = "an integer" if kind is int else "a number"
            problem = str(exc) if isinstance(exc, UnitError) else f"expected {number}"
            raise ScenarioError(option, text, problem) from None

    def integer(option: str, text: str | None) -> int | None:
        return None if text is None else int(parse(option, text, int))

    op = check("--op", args.op, OPS, "unknown collective")  # all-reduce reads as all_reduce
    algorithm = check("--algorithm", args.algorithm, algorithm_names(op), f"not one for {op}")
    try:
        sizes = [parse("--size", s, parse_bytes) for s in args.sizes]
        if args.min_size is not None or args.max_size is not None:
            lo = parse("--min", args.min_size or args.max_size, parse_bytes)
            hi = parse("--max", args.max_size or args.min_size, parse_bytes)
            sizes += size_sweep(lo, hi, parse("--factor", args.factor, float))
        if not sizes:
            raise ScenarioError("--size", MISSING, "give at least one --size, or --min and --max")
        rows = run_collective(
            args.instance, integer("--count", args.count) or 0, op, sizes,
            algorithm=algorithm, ranks=integer("--ranks", args.ranks),
            lnc=integer("--lnc", args.lnc), chip_model=args.chip_model or "roofline",
            fabric_file=args.fabric_file,
            protocol=args.protocol,
        )  # fmt: skip
    except ScenarioError as exc:
        if exc.path.startswith("-"):
            raise
        option = "--size" if exc.path == "sizes" else f"--{exc.path.split('.')[0]}"
        raise ScenarioError(option, exc.value, exc.problem) from None
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    title = f"{op} on {args.count} x {args.instance}, {rows[0]['ranks']} ranks"
    console().print(collective_table(rows, title))
    return 0


# -- bench ----------------------------------------------------------------------------


def _bench(args: argparse.Namespace) -> int:
    from clustersim.bench import bench_tables, run_bench, select_cases
    from clustersim.terminal import console

    names = select_cases(args.only, quick=args.quick)
    if not 0 < args.timeout < float("inf"):
        raise ScenarioError("--timeout", args.timeout, "must be a positive number of seconds")
    try:
        max_rss = parse_bytes(args.max_rss)
    except UnitError as exc:
        raise ScenarioError("--max-rss", args.max_rss, str(exc)) from None
    err = console(stderr=True)
    err.print(
        f"bench: {len(names)} cases, each in a fresh process, at most {args.timeout:g} s each: "
        + ", ".join(names)
    )

    def done(i: int, n: int, case: dict[str, Any]) -> None:
        wall = f"{case['wall_s']:.1f} s" if case["wall_s"] is not None else "-"
        err.print(f"  [{i}/{n}] {case['name']}: {case['status']}, {wall}", markup=False)

    result = run_bench(names, timeout_s=args.timeout, max_rss_bytes=max_rss, on_case=done)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    con = console()
    for table in bench_tables(result):
        con.print(table)
    return 0


def _validate(args: argparse.Namespace) -> int:
    from clustersim.validation.command import validate_command

    return validate_command(args)


def _topology(args: argparse.Namespace) -> int:
    from clustersim.sim.fabric_command import topology_command

    return topology_command(args)


def _export(args: argparse.Namespace) -> int:
    from clustersim.scenario import load_scenario
    from clustersim.sim.chakra_command import export_command

    res = load_scenario(args.scenario, args.sets)
    res.require_training("export")
    print(export_command(res, args.out, args.prefix, ranks=args.ranks, compress=args.gzip))
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from clustersim.calibration.command import calibrate_command

    return calibrate_command(args)


def _sweep(args: argparse.Namespace) -> int:
    from clustersim.sweep.command import sweep_command

    return sweep_command(args)


def _search(args: argparse.Namespace) -> int:
    from clustersim.search.command import search_command

    return search_command(args)


def _reliability(args: argparse.Namespace) -> int:
    from clustersim.failures.command import reliability_command
    from clustersim.sim import degraded_step, simulate

    return reliability_command(args, lambda res: simulate(res, record=False).summary, degraded_step)


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _run,
    "serve": _serve,
    "serve-search": _serve_search,
    "check": _check,
    "catalog": _catalog,
    "schema": _schema,
    "collective": _collective,
    "report": _report,
    "bench": _bench,
    "reliability": _reliability,
    "sweep": _sweep,
    "topology": _topology,
    "export": _export,
    "search": _search,
    "validate": _validate,
    "calibrate": _calibrate,
}
