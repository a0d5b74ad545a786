"""``clustersim reliability``: the command's logic and printing (``cli.py`` only parses).

The step time comes from ``--step-time`` or from a quick step simulation (the
caller passes the function that runs one, so that this package does not import
the simulator above it). Then the long-horizon model runs over ``--seeds`` seeds
on ``--workers`` processes, and with ``--checkpoint-study`` over a grid of
checkpoint intervals too.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from clustersim import cost
from clustersim.errors import ScenarioError
from clustersim.failures.jobs import build_job, needs_degraded_step
from clustersim.failures.studies import (
    TIMELINE_FILE,
    checkpoint_study,
    default_workers,
    run_seeds,
    summarise,
    timeline_frame,
)
from clustersim.progress import Bar
from clustersim.terminal import console
from clustersim.units import UnitError, format_seconds, parse_duration

if TYPE_CHECKING:
    from clustersim.scenario import Resolved

__all__ = ["RESULT_FILE", "reliability_command", "tables"]

RESULT_FILE = "reliability.json"
MeasureStep = Callable[["Resolved"], dict[str, Any]]
"""Simulates one step of a scenario and returns its summary."""
DeriveDegraded = Callable[["Resolved"], "dict[str, Any] | None"]
"""Derives the degraded step time of ``continue_degraded`` by simulation (``sim.degraded``):
``{step_time_s, method, ...}``, or None when the scenario needs none."""


def _duration(option: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = parse_duration(text)
    except UnitError as exc:
        raise ScenarioError(option, text, str(exc)) from None
    if not 0 < value < float("inf"):
        raise ScenarioError(option, text, "must be a positive duration")
    return value


def _count(option: str, value: int | None, most: int) -> None:
    if value is not None and not 1 <= value <= most:
        raise ScenarioError(option, value, f"must be between 1 and {most:,}")


def _usd_per_hour(res: Resolved) -> float:
    sc = res.scenario
    try:  # pricing modes that need the chip (owned) take it as a fourth argument
        return cost.usd_per_hour(res.instance, sc.cluster.count, sc.cost, res.chip)  # type: ignore[call-arg,unused-ignore]
    except TypeError:
        return cost.usd_per_hour(res.instance, sc.cluster.count, sc.cost)


class _Bar:
    """A rich progress bar over replications, shown once a study has run a second."""

    def __init__(self, console: Console, label: str) -> None:
        self.bar = Bar(console, label, delay_s=1.0)

    def __call__(self, done: int, total: int) -> None:
        self.bar.update(done, total)

    def close(self) -> None:
        self.bar.close()


def reliability_command(
    args: argparse.Namespace,
    measure_step: MeasureStep,
    derive_degraded: DeriveDegraded | None = None,
) -> int:
    from clustersim.scenario import load_scenario

    t0 = time.perf_counter()
    res = load_scenario(args.scenario, args.sets, args.seed)
    res.require_training("reliability")
    cfg = res.scenario.failures
    if not cfg.reliability:
        raise ScenarioError(
            "failures.preset", None, "no failure rates: set failures.preset or failures.rates"
        )
    _count("--seeds", args.seeds, 100_000)
    _count("--workers", args.workers, 1024)
    _count("--points", args.points, 1000)
    step = _duration("--step-time", args.step_time)
    degraded = _duration("--degraded-step-time", args.degraded_step_time)
    err = console(stderr=True)
    quiet = args.quiet or args.json
    step_source = "given"
    if step is None:
        if not quiet:
            err.print(f"simulating one step of {res.scenario.name} for its step time ...")
        measured = measure_step(res)
        step, usd_h, step_source = (
            measured["step_time_s"],
            measured["cost"]["usd_per_hour"],
            "simulated",
        )
        derived = (measured.get("reliability") or {}).get("degraded_step")
    else:
        usd_h = _usd_per_hour(res)
        derived = None
    if (
        degraded is None
        and derived is None
        and derive_degraded is not None
        and needs_degraded_step(res)
    ):
        if not quiet:
            err.print("simulating the step with a link cut for the degraded step time ...")
        derived = derive_degraded(res)
        if derived is not None and step_source == "given":  # the cut's slowdown, on --step-time
            derived = {
                **derived,
                "step_time_s": derived["slowdown"] * step,
                "method": f"{derived['method']}; its slowdown applied to --step-time",
            }
    if degraded is None and derived is not None:
        degraded = derived["step_time_s"]
    setup = build_job(res, step, degraded)
    seeds = args.seeds or cfg.seeds
    workers = args.workers or default_workers()
    bar = None if quiet else _Bar(err, f"{seeds} seeds")
    t_mc = time.perf_counter()
    try:
        outcomes = run_seeds(setup.model, seeds, res.scenario.seed, workers=workers, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    result = summarise(
        setup, outcomes, usd_h, preset=cfg.preset, instances=res.scenario.cluster.count,
        wall_s=time.perf_counter() - t_mc,
    )  # fmt: skip
    result = {
        "scenario": res.scenario.name,
        "chips": res.chips,
        "step_time_source": step_source,
        **result,
    }
    if derived is not None and args.degraded_step_time is None:
        result["degraded_step"] = derived
    if args.checkpoint_study:
        bar = (
            None
            if quiet
            else _Bar(err, f"checkpoint study: {args.points} intervals x {seeds} seeds")
        )
        try:
            result["checkpoint_study"] = checkpoint_study(
                setup, seeds, res.scenario.seed, points=args.points, workers=workers, progress=bar
            )
        finally:
            if bar is not None:
                bar.close()
    result["command_wall_s"] = time.perf_counter() - t0
    if args.out is not None:
        from clustersim.trace.io import atomic_write_text, write_parquet

        args.out.mkdir(parents=True, exist_ok=True)
        from clustersim.trace.horizon import RELIABILITY_TRACE, write_reliability_trace

        timeline = timeline_frame(outcomes)
        write_parquet(args.out / TIMELINE_FILE, timeline)
        write_reliability_trace(args.out / RELIABILITY_TRACE, timeline)
        atomic_write_text(args.out / RESULT_FILE, json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
    elif not args.quiet:
        con = console()
        for table in tables(result):
            con.print(table)
        if args.out is not None:
            con.print(f"wrote {args.out / RESULT_FILE} and {args.out / TIMELINE_FILE}")
    return 0


def _size(n: float) -> str:
    return f"{n / 1e12:.2f} TB" if n >= 1e11 else f"{n / 1e9:.3g} GB"


def _ci(ci: list[float] | None, fmt: str) -> str:
    return "" if ci is None else f"95% CI {format(ci[0], fmt)} .. {format(ci[1], fmt)}"


def tables(r: dict[str, Any], *, wall: bool = True) -> list[Table]:
    """The result as rich tables: the job, interruptions by cause, the interval study.
    With ``wall=False`` the wall times are left out: what the docs quote, the same for
    every run of the command."""
    ci, ck = r["ci95"], r["checkpoint"]
    horizon = (
        f"{format_seconds(r['horizon_s'])}" if r["horizon_s"] is not None
        else f"to {r['target_tokens']:.3g} tokens"
    )  # fmt: skip
    t = Table(
        title=f"{r['scenario']}: {r['chips']:,} chips, {horizon}, {r['seeds']} seeds, "
        f"recovery {r['recovery']}",
        show_header=False, title_justify="left",
    )  # fmt: skip
    for col in ("metric", "value", "note"):
        t.add_column(col, justify="right" if col == "value" else "left")
    t.add_row("step time", f"{r['step_time_s']:.3f} s", f"{r['step_time_source']}; "
              f"{r['tokens_per_step']:,.0f} tokens per step")  # fmt: skip
    if r.get("degraded_step_time_s") is not None:
        how = r.get("degraded_step")
        note = f"derived: {how['method']}" if how else "given"
        t.add_row("degraded step", f"{r['degraded_step_time_s']:.3f} s", note)
    t.add_row("failures", f"{r['failures_per_day']:.2f} /day",
              f"job MTBF {format_seconds(r['mtbf_s'])}")  # fmt: skip
    t.add_row(
        "checkpoint", f"every {format_seconds(ck['interval_s'])}",
        f"{ck['mode']}, {_size(ck['size_bytes'])} in {format_seconds(ck['write_s'])}; "
        f"Young {format_seconds(ck['young_s'])}, Daly {format_seconds(ck['daly_s'])}",
    )  # fmt: skip
    t.add_row("interruptions", f"{r['interruptions']:.1f}", _ci(ci["interruptions"], ".1f"))
    t.add_row("goodput", f"{r['goodput']:.2%}", _ci(ci["goodput"], ".2%"))
    t.add_row("ETTR", f"{r['ettr']:.2%}", _ci(ci["ettr"], ".2%"))
    lost = r["lost"]
    t.add_row("work lost", f"{lost['tokens']:.3g} tok",
              f"{format_seconds(lost['training_s'])} of training redone, "
              f"{format_seconds(lost['downtime_s'])} down")  # fmt: skip
    if r["target_tokens"] is not None:
        ttt, tci = r["time_to_target_s"], ci["time_to_target_s"]
        shown = format_seconds(ttt) if ttt is not None else "not reached"
        note = f"95% CI {format_seconds(tci[0])} .. {format_seconds(tci[1])}" if tci else ""
        t.add_row("time to target", shown, note)
    c = r["cost"]
    spent = f"${c['usd_total']:,.0f} in all at ${c['usd_per_hour']:,.0f}/h (spares included)"
    per_m = c["usd_per_million_useful_tokens"]
    shown = f"${per_m:.3f} /M useful tok" if per_m is not None else "no useful work"
    t.add_row("cost", shown, spent)
    if wall:
        t.add_row("simulated in", f"{r['wall_s']:.2f} s", f"{r['seeds']} seeds")
    out = [t]
    by = Table(title="interruptions by cause (mean per run)", title_justify="left")
    for col in ("cause", "per", "components", "MTBF each", "count", "lost tokens", "down"):
        by.add_column(col, justify="left" if col in ("cause", "per") else "right")
    per_cause: dict[str, dict[str, Any]] = {}
    for cls in r["classes"]:
        per_cause.setdefault(cls["cause"], cls)
    for cause, n in sorted(r["interruptions_by_cause"].items(), key=lambda kv: -kv[1]):
        cls = per_cause[cause]
        lb = lost["by_cause"][cause]
        by.add_row(
            cause, cls["per"], f"{cls['components']:,}", format_seconds(cls["mtbf_s"]),
            f"{n:.1f}", f"{lb['tokens']:.3g}", format_seconds(lb["downtime_s"]),
        )  # fmt: skip
    out.append(by)
    study = r.get("checkpoint_study")
    if study is not None:
        took = f", {study['wall_s']:.1f} s" if wall else ""
        st = Table(
            title=f"checkpoint interval study ({study['seeds']} seeds per interval{took}): "
            f"simulated optimum {format_seconds(study['best_s'])}, "
            f"Young {format_seconds(study['young_s'])}, Daly {format_seconds(study['daly_s'])}",
            title_justify="left",
        )
        for col in ("interval", "ETTR", "95% CI", "goodput", ""):
            st.add_column(col, justify="right")
        for row in study["rows"]:
            mark = "best" if row["interval_s"] == study["best_grid_s"] else ""
            st.add_row(
                format_seconds(row["interval_s"]), f"{row['ettr']:.3%}",
                _ci(row["ettr_ci95"], ".3%").removeprefix("95% CI "), f"{row['goodput']:.3%}", mark,
            )  # fmt: skip
        out.append(st)
    return out
