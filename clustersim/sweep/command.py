"""``clustersim sweep``: the command's logic and printing (``cli.py`` only parses).

Exit codes: 0 when the study ran (failed points are recorded in the results,
and listed), 2 on a bad study file or when every point failed on bad input (a
typo in the base scenario), with the first error on one line.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from clustersim.errors import MISSING, ScenarioError
from clustersim.sweep.execute import default_workers
from clustersim.sweep.guard import StudyLimits
from clustersim.sweep.run import StudyOutcome, StudyProgress, make_executor, run_study
from clustersim.sweep.spec import load_study
from clustersim.terminal import console
from clustersim.units import UnitError, parse_bytes

__all__ = ["VALIDATING_DELAY_S", "RichProgress", "sweep_command"]


def _slug(name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return slug[:80] or "study"


VALIDATING_DELAY_S = 1.0
"""The up-front check shows a bar only once it has taken this long."""


class RichProgress(StudyProgress):
    """A rich bar: the up-front check when it takes more than a moment, then the points
    done, failed and remaining, with an ETA."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._bar: Any = None
        self._task: Any = None
        self._checking_since: float | None = None
        self.failed = 0
        self.done = 0
        self.total = 0

    def _open(self, label: str, total: int, done: int, note: str) -> None:
        self.close()
        self._bar = Progress(
            TextColumn(label),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[note]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task(label, total=total, completed=done, note=note)

    def validating(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if self._checking_since is None:
            self._checking_since = now
        if self._bar is None:
            if now - self._checking_since < VALIDATING_DELAY_S or done >= total:
                return
            self._open("validating", total, done, "")
        self._bar.update(self._task, completed=done, total=total)

    def start(self, total: int, done: int, failed: int, executor: str) -> None:
        self.close()  # the check's bar, if it showed
        self.total, self.done, self.failed = total, done, failed
        if done:
            self.console.print(f"resuming: {done} of {total} points already done", markup=False)
        if executor:
            self.console.print(f"running {total - done} points on {executor}", markup=False)
        self._open("points", total, done, self._note())

    def _note(self) -> str:
        return f"{self.failed} failed, {self.total - self.done} left"

    def advance(self, ok: bool) -> None:
        self.done += 1
        self.failed += not ok
        if self._bar is not None:
            self._bar.update(self._task, advance=1, note=self._note())

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def sweep_command(args: argparse.Namespace) -> int:
    study = load_study(args.study, allow_outside=args.allow_outside)
    if args.chip_model:  # --chip-model: the base scenario's chip_model, for every point
        study.base["chip_model"] = args.chip_model
    out: Path = args.out or Path("reports") / _slug(study.name)
    if args.scheduler is not None and args.dask_local is not None:
        raise ScenarioError(
            "--scheduler", args.scheduler, "give --scheduler or --dask-local, not both"
        )
    if args.workers is not None and (args.scheduler is not None or args.dask_local is not None):
        raise ScenarioError("--workers", args.workers, "is for the local pool; Dask sizes itself")

    def factory() -> Any:
        return make_executor(args.workers, args.scheduler, args.dask_local)

    limits = _limits(args)
    # Points that run at once: the local pool's workers, a LocalCluster's; on a remote
    # scheduler each worker holds its own point, so one at a time counts.
    concurrent = args.dask_local or (1 if args.scheduler else args.workers or default_workers())

    err = console(stderr=True)
    progress = None if (args.quiet or args.json) else RichProgress(err)
    t0 = time.perf_counter()
    outcome = run_study(
        study,
        out,
        factory,
        force=args.force,
        keep_runs=args.keep_runs,
        retry_failed=args.retry_failed,
        progress=progress,
        limits=limits,
        concurrent=concurrent,
    )
    if outcome.all_bad_input and outcome.failures:
        # Every point is invalid: most likely the base scenario or `set` is. Say so as
        # `run` would (the failed points are recorded all the same).
        if outcome.first_input_error is not None:
            raise outcome.first_input_error
        first = outcome.failures[0]
        raise ScenarioError(
            f"point {first.get('index')}", MISSING, f"every point failed: {first['error']}"
        )
    if args.json:
        print(json.dumps(_outcome_json(outcome, time.perf_counter() - t0), indent=2))
    elif not args.quiet:
        console().print(_outcome_table(outcome))
    return 0


def _outcome_json(o: StudyOutcome, wall_s: float) -> dict[str, Any]:
    return {
        "study": o.study.name,
        "out": str(o.out),
        "points": o.points,
        "skipped": o.skipped,
        "ran": o.ran,
        "ok": o.ok,
        "failed": o.failed,
        "executor": o.executor,
        "wall_s": wall_s,
        "failures": [
            {"point": f["id"], "index": f.get("index"), "error": f.get("error")} for f in o.failures
        ],
    }


def _outcome_table(o: StudyOutcome) -> Table:
    t = Table(title=f"study {o.study.name}", show_header=False, title_justify="left")
    t.add_column("what", style="bold")
    t.add_column("value", justify="right")
    t.add_column("note")
    t.add_row("points", f"{o.points:,}", f"{o.skipped:,} done before, {o.ran:,} run now")
    t.add_row("ok", f"{o.ok:,}", "")
    t.add_row("failed", f"{o.failed:,}", "recorded with their error" if o.failed else "")
    t.add_row("wall time", f"{o.wall_s:.1f} s", o.executor or "nothing left to run")
    ok = o.frame[o.frame["status"] == "ok"] if len(o.frame) else o.frame
    if len(ok) and "cost.usd_per_million_tokens" in ok.columns:
        rows = ok.to_dict("records")
        best = min(rows, key=lambda r: float(r["step_time_s"]))
        cheap = min(rows, key=lambda r: float(r["cost.usd_per_million_tokens"]))
        t.add_row("fastest", f"{best['step_time_s']:.4g} s", f"point {best['point']}")
        cheapest = f"${cheap['cost.usd_per_million_tokens']:.4g} /M tok"
        t.add_row("cheapest", cheapest, f"point {cheap['point']}")
    for f in o.failures[:5]:
        t.add_row("  failed", f"point {f.get('index')}", str(f.get("error", "")), style="red")
    t.add_row("written to", str(o.out / "results.parquet"), "")
    return t


def _limits(args: argparse.Namespace) -> StudyLimits:
    """``--max-events`` and ``--max-memory``: the whole study's limits."""
    default = StudyLimits()
    events = default.max_events if args.max_events is None else args.max_events
    if not 0 < events < float("inf"):
        raise ScenarioError("--max-events", args.max_events, "must be a positive number")
    memory = default.max_memory_bytes
    if args.max_memory is not None:
        try:
            memory = parse_bytes(args.max_memory)
        except UnitError as exc:
            raise ScenarioError("--max-memory", args.max_memory, str(exc)) from None
        if not 0 < memory < float("inf"):
            raise ScenarioError("--max-memory", args.max_memory, "must be a positive size")
    return StudyLimits(max_events=events, max_memory_bytes=memory)
