"""``clustersim validate``: run the reference set, print the table, exit 1 on a miss."""

from __future__ import annotations

import argparse
import json
import resource
import time
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from clustersim.terminal import console
from clustersim.validation import (
    MEAN_TOLERANCE,
    Row,
    Status,
    mean_training_error,
    passed,
    role_errors,
    validate,
)
from clustersim.validation.parallel import default_jobs

__all__ = ["rows_table", "validate_command"]


def _fmt(value: float, unit: str) -> str:
    """A figure in its unit: seconds as min, s, ms or us; fractions as percentages; a
    rate (``tok/s``) as it is."""
    if unit == "fraction":
        return f"{value:.2%}"
    if unit != "s":
        return f"{value:,.0f} {unit}"
    if value >= 600:
        return f"{value / 60:.2f} min"
    if value >= 1:
        return f"{value:.3f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3f} ms"
    return f"{value * 1e6:.2f} us"


def _mfu(row: Row) -> str:
    if row.mfu_published is None or row.mfu_predicted is None:
        return ""
    return f"{row.mfu_published:.1%} / {row.mfu_predicted:.1%}"


def _share(part: float | None, row: Row) -> str:
    """A part of the predicted step as a percentage of it."""
    if part is None or row.predicted <= 0:
        return ""
    return f"{part / row.predicted:.1%}"


def _status(row: Row) -> str:
    if row.status == "known_gap":
        return "gap"
    return "ok" if row.passed else "MISS"


ROLE_ORDER = {"calibration": 0, "holdout": 1, "analytic": 2}


def grouped(rows: list[Row]) -> list[Row]:
    """Rows grouped by role (calibration, holdout, analytic), known gaps last in each."""
    return sorted(
        rows, key=lambda r: (ROLE_ORDER.get(r.role, 3), r.status == "known_gap")
    )  # sorted() is stable: the file order stays within a group


def rows_table(rows: list[Row]) -> Table:
    """One line per reference, grouped by role: published and predicted figures, error,
    tolerance, the predicted bubble and exposed communication (shares of the step), MFU."""
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("reference", no_wrap=True)
    t.add_column("role", no_wrap=True)
    t.add_column("metric", no_wrap=True)
    for col in ("published", "predicted", "error", "tolerance", "bubble", "exp. comm"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("MFU pub / pred", justify="right", no_wrap=True)
    t.add_column("status", no_wrap=True)
    last = None
    for r in grouped(rows):
        if last is not None and r.role != last:
            t.add_section()
        last = r.role
        t.add_row(
            r.name, r.role, r.metric, _fmt(r.published, r.unit), _fmt(r.predicted, r.unit),
            f"{r.error:+.2%}", f"{r.tolerance:.0%}", _share(r.bubble_s, r),
            _share(r.exposed_comm_s, r), _mfu(r), _status(r),
        )  # fmt: skip
    return t


def holdout_coverage(rows: list[Row]) -> dict[str, int] | None:
    """How many holdout rows' published step lies inside the prediction's 90% interval
    (``uncertainty`` from the family's calibration): it should be about nine in ten."""
    held = [r for r in rows if r.kind == "training" and r.role == "holdout"]
    bands = [(r, r.extra.get("uncertainty")) for r in held]
    known = [(r, b) for r, b in bands if b]
    if not known:
        return None
    inside = sum(1 for r, b in known if b[0] <= r.published <= b[1])
    return {"rows": len(known), "inside": inside}


class Display:
    """validate's progress on stderr. On a terminal, a bar: references done of all, and
    the running ones, longest running first, with their times. Anywhere else (a CI log),
    a line as each reference starts. It keeps the largest peak memory of a row's process."""

    SHOWN = 3
    """Running references named on the bar; the others are counted."""

    def __init__(self, err: Console) -> None:
        self.err = err
        self.bar: Any = None
        self.task: Any = None
        self.started: set[str] = set()
        self.peak_bytes, self.peak_name = 0, ""

    def __call__(self, st: Status) -> None:
        if st.finished is not None and st.finished_peak_bytes > self.peak_bytes:
            self.peak_bytes, self.peak_name = st.finished_peak_bytes, st.finished
        if not self.err.is_terminal:
            for name in st.running:
                if name not in self.started:
                    self.started.add(name)
                    self.err.print(f"  {name} ...", markup=False)
            return
        if self.bar is None:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            # Parallel runs fork their workers: no refresh thread then, this draws on each
            # call (at least once a second); a serial run may keep rich's own.
            self.bar = Progress(
                TextColumn("validate"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.description}"),
                console=self.err, transient=True, auto_refresh=st.jobs == 1,
            )  # fmt: skip
            self.bar.start()
            self.task = self.bar.add_task("", total=st.total)
        now = time.perf_counter()
        running = sorted(st.running.items(), key=lambda kv: kv[1])
        label = ", ".join(f"{name} {now - t0:.0f} s" for name, t0 in running[: self.SHOWN])
        if len(running) > self.SHOWN:
            label += f" and {len(running) - self.SHOWN} more"
        self.bar.update(self.task, completed=st.done, total=st.total, description=label)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def _peak_line(display: Display, jobs: int) -> str:
    """The run's peak memory: the largest row process's, or this process's."""
    if jobs > 1 and display.peak_bytes:
        return (
            f"{jobs} worker processes; the largest peaked at "
            f"{display.peak_bytes / 2**30:.2f} GiB ({display.peak_name})"
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return f"one process; peak memory {peak / 2**30:.2f} GiB"


def validate_command(args: argparse.Namespace) -> int:
    """Handler of ``clustersim validate [--json] [--only NAME ...] [--quick] [--jobs N]``."""
    err = console(stderr=True)
    t0 = time.perf_counter()
    jobs = args.jobs if args.jobs is not None else default_jobs()
    display = Display(err)
    try:
        rows = validate(
            args.only, quick=args.quick, jobs=jobs, progress=None if args.json else display
        )
    finally:
        display.close()
    wall = time.perf_counter() - t0
    whole = not args.only  # the mean's bound is the set's, not one picked row's
    ok = passed(rows, whole_set=whole)
    mean = mean_training_error(rows)
    out = {
        "passed": ok,
        "mean_abs_training_error": mean,
        "mean_tolerance": MEAN_TOLERANCE,
        "by_role": role_errors(rows),
        "holdout_coverage": holdout_coverage(rows),
        "wall_s": wall,
        "rows": [r.as_dict() for r in rows],
    }
    if getattr(args, "json_out", None) is not None:
        args.json_out.write_text(json.dumps(out, indent=2), "utf-8")
    if args.json:
        print(json.dumps(out, indent=2))
        return 0 if ok else 1
    con = console()
    con = Console(width=max(con.width, 160))  # the table's natural width
    con.print(rows_table(rows))
    notes = [f"{r.name}: {r.note}" for r in rows if r.note]
    for note in notes:
        con.print(f"note {note}", markup=False)
    for r in rows:
        if r.status == "known_gap":
            con.print(f"known gap {r.name} ({r.error:+.1%}): {r.gap}", markup=False)
    for role, agg in role_errors(rows).items():
        con.print(
            f"{role} rows: {agg['rows']:.0f}, mean |error| {agg['mean_abs_error']:.2%}, "
            f"max {agg['max_abs_error']:.2%}",
            markup=False,
        )
    cover = holdout_coverage(rows)
    if cover is not None:
        con.print(
            f"holdout rows inside their 90% interval: {cover['inside']} of {cover['rows']}",
            markup=False,
        )
    if mean is not None:
        con.print(
            f"checked end-to-end rows: mean |error| {mean:.2%} "
            + (
                f"(at most {MEAN_TOLERANCE:.0%})"
                if whole
                else f"(the {MEAN_TOLERANCE:.0%} bound is the whole set's, not checked with --only)"
            ),
            markup=False,
        )
    misses = sum(not r.passed for r in rows)
    if ok:
        verdict = "passed"
    elif misses:
        verdict = f"FAILED ({misses} of {len(rows)} rows out of tolerance)"
    else:
        verdict = f"FAILED (the mean |error| is over {MEAN_TOLERANCE:.0%})"
    con.print(f"{len(rows)} references {verdict} in {wall:.1f} s", markup=False)
    con.print(_peak_line(display, min(jobs, len(rows))), markup=False)
    return 0 if ok else 1
