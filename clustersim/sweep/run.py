"""Running a study: expand, validate every point, skip those done, run the rest.

Every point is validated up front (``check.check_points``: each distinct value of
each section resolved once, the points that take a bad one resolved whole), so a
typo along one axis value becomes a failed point at once instead of a crash
half-way; the valid points then go to the executor, and each record is
persisted the moment it comes back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustersim.errors import ScenarioError
from clustersim.sweep.axes import expand
from clustersim.sweep.check import check_points
from clustersim.sweep.execute import (
    DaskExecutor,
    Executor,
    LocalExecutor,
    PointTask,
    failed_record,
)
from clustersim.sweep.guard import StudyLimits, check_study_work
from clustersim.sweep.spec import Study
from clustersim.sweep.store import StudyStore

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["StudyOutcome", "StudyProgress", "make_executor", "run_study"]


class StudyProgress:
    """Callbacks of a running study (the CLI draws a progress bar from them)."""

    def validating(self, done: int, total: int) -> None:
        """The up-front check of the points: ``done`` of ``total`` checks made (the
        total may grow as it goes). Called every tenth of a second or so, and once at
        the end."""

    def start(self, total: int, done: int, failed: int, executor: str) -> None:
        """``total`` points, ``done`` of them (``failed`` among them) already finished;
        ``executor`` describes where the rest run ("" when none is valid to run)."""

    def advance(self, ok: bool) -> None:
        """One more point finished."""

    def close(self) -> None: ...


@dataclass
class StudyOutcome:
    study: Study
    out: Path
    points: int
    skipped: int  # finished by an earlier run
    ran: int
    ok: int
    failed: int
    wall_s: float
    executor: str
    frame: pd.DataFrame
    failures: list[dict[str, Any]] = field(default_factory=list)  # the first few
    all_bad_input: bool = False  # every point failed on bad input (a typo in the base, say)
    first_input_error: ScenarioError | None = None  # found validating the points up front


def make_executor(
    workers: int | None = None,
    scheduler: str | None = None,
    dask_local: int | None = None,
    *,
    dask_processes: bool = True,
) -> Executor:
    """The local pool, or Dask when ``scheduler`` or ``dask_local`` is given."""
    if scheduler is not None and dask_local is not None:
        raise ScenarioError("--scheduler", scheduler, "give --scheduler or --dask-local, not both")
    if scheduler is not None or dask_local is not None:
        return DaskExecutor(scheduler, dask_local, processes=dask_processes)
    return LocalExecutor(workers)


def run_study(
    study: Study,
    out: Path,
    executor_factory: Callable[[], Executor],
    *,
    force: bool = False,
    keep_runs: bool = False,
    retry_failed: bool = False,
    progress: StudyProgress | None = None,
    limits: StudyLimits | None = None,
    concurrent: int = 1,
) -> StudyOutcome:
    """Run every point of ``study`` not yet in ``out``; write ``results.parquet``.

    Before any point runs, the points to run are estimated together and the study is
    refused when they exceed ``limits`` (``sweep.guard``; ``concurrent`` points run at
    once)."""
    t0 = time.perf_counter()
    progress = progress or StudyProgress()
    points = expand(study)
    by_id = {p.id: p for p in points}
    store = StudyStore(out)
    store.open(study, points, force=force)
    try:
        records = {
            pid: rec
            for pid, rec in store.finished(retry_failed=retry_failed).items()
            if pid in by_id
        }
        skipped = len(records)
        run_cfg = study.spec.run
        pending = [p for p in points if p.id not in records]
        invalid = check_points(study, points, progress.validating, skip=records.keys())
        todo = [
            PointTask(
                p.id,
                study.base,
                p.overrides,
                run_cfg.fidelity,
                run_cfg.max_events,
                run_cfg.max_memory,
                str(out / "runs" / p.id) if keep_runs else None,
            )
            for p in pending
            if p.id not in invalid
        ]
        first_error = next((invalid[p.id] for p in pending if p.id in invalid), None)
        if todo:  # before anything runs: the whole study's work, against its limits
            check_study_work(
                study.base,
                [by_id[t.id] for t in todo],
                run_cfg.fidelity,
                limits or StudyLimits(),
                concurrent=concurrent,
            )
        already_failed = sum(r.get("status") != "ok" for r in records.values())
        executor = executor_factory() if todo else None
        description = executor.description if executor is not None else ""
        progress.start(len(points), skipped, already_failed, description)
        try:
            for p in pending:
                if p.id in invalid:
                    rec = failed_record(p.id, str(invalid[p.id]), "input")
                    records[p.id] = store.save(p, rec, study)
                    progress.advance(False)
            if executor is not None:
                for rec in executor.run(todo):
                    p = by_id[rec["id"]]
                    records[p.id] = store.save(p, rec, study)
                    progress.advance(rec["status"] == "ok")
        finally:
            progress.close()
            if executor is not None:
                executor.close()
        frame = store.write_results(points, records, study)
    finally:
        progress.close()  # again: also when the check up front raised
        store.close()
    ordered = [records[p.id] for p in points if p.id in records]
    failures = [r for r in ordered if r.get("status") != "ok"]
    ok = len(ordered) - len(failures)
    return StudyOutcome(
        study=study,
        out=out,
        points=len(points),
        skipped=skipped,
        ran=len(ordered) - skipped,
        ok=ok,
        failed=len(failures),
        wall_s=time.perf_counter() - t0,
        executor=description,
        frame=frame,
        failures=failures[:20],
        all_bad_input=bool(ordered) and all(r.get("error_kind") == "input" for r in ordered),
        first_input_error=first_error,
    )
