"""Running points: the worker function and the executors that call it.

``run_point`` simulates one point in the worker's own process (no subprocess):
the base scenario with the point's overrides applied as ``--set`` would, then
``simulate`` and its summary. It never raises for a bad point: the error is
returned in the record, so one failure does not stop a study.

Executors run tasks and yield records as they finish, in completion order:

- ``LocalExecutor``: a ``concurrent.futures.ProcessPoolExecutor`` on N cores (in the
  calling process when N is 1);
- ``DaskExecutor``: a ``distributed.Client`` on an existing scheduler
  (``tcp://host:8786``) or on a ``LocalCluster`` it starts on loopback. Tasks go
  through ``client.submit`` and come back through ``distributed.as_completed``.
  ``distributed`` is imported only here, when asked for.
"""

from __future__ import annotations

import copy
import json
import os
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from clustersim.errors import MISSING, ClusterSimError, ScenarioError

__all__ = [
    "DaskExecutor",
    "Executor",
    "LocalExecutor",
    "PointTask",
    "resolve_point",
    "run_point",
]


@dataclass(frozen=True)
class PointTask:
    """What a worker needs to run one point (plain data: it travels by pickle)."""

    id: str
    base: dict[str, Any]
    overrides: tuple[str, ...]
    fidelity: Literal["auto", "detailed", "folded"] = "auto"
    max_events: float = 60e6
    max_memory_bytes: float = 8 * 2**30
    run_dir: str | None = None  # with --keep-runs: write the point's run outputs here


def resolve_point(task: PointTask) -> Any:
    """The point's resolved scenario; a ``ScenarioError`` if it is invalid."""
    from clustersim.scenario import apply_set, resolve

    data = copy.deepcopy(task.base)
    for assignment in task.overrides:
        apply_set(data, assignment)
    return resolve(data)


def failed_record(task_id: str, error: str, kind: str, wall_s: float = 0.0) -> dict[str, Any]:
    return {
        "id": task_id,
        "status": "failed",
        "error": error,
        "error_kind": kind,
        "summary": None,
        "wall_s": wall_s,
    }


def run_point(task: PointTask) -> dict[str, Any]:
    """Simulate one point; return its record (``status`` ok with the summary, or failed
    with the error). Bad input and internal errors alike are caught and recorded."""
    t0 = time.perf_counter()
    try:
        from clustersim.sim import Limits, simulate

        res = resolve_point(task)
        limits = Limits(max_events=task.max_events, max_memory_bytes=task.max_memory_bytes)
        keep = task.run_dir is not None
        result = simulate(res, limits=limits, fidelity=task.fidelity, record=keep)
        summary = result.summary
        if task.run_dir is not None:
            _write_run(Path(task.run_dir), res, result)
    except ClusterSimError as exc:
        kind = "input" if isinstance(exc, ScenarioError) else "simulation"
        return failed_record(task.id, str(exc), kind, time.perf_counter() - t0)
    except Exception as exc:  # a bug or exhaustion: record it, keep the study going
        detail = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return failed_record(
            task.id, f"internal error: {detail}", "internal", time.perf_counter() - t0
        )
    return {
        "id": task.id,
        "status": "ok",
        "error": None,
        "error_kind": None,
        "summary": summary,
        "wall_s": time.perf_counter() - t0,
    }


def _write_run(out: Path, res: Any, result: Any) -> None:
    """The files ``clustersim run`` writes, summary last (it marks a complete result)."""
    import yaml

    from clustersim.report import RunData, write_report
    from clustersim.trace import LINK_TABLE, atomic_write_text, write_link_table, write_parquet

    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").unlink(missing_ok=True)
    resolved = res.as_dict()
    resolved_yaml = yaml.safe_dump(resolved, sort_keys=False)
    atomic_write_text(out / "resolved_scenario.yaml", resolved_yaml)
    frame = result.trace_frame() if res.scenario.output.trace else None
    if frame is not None:
        write_parquet(out / "trace.parquet", frame)
    links = result.link_table()
    write_link_table(out / LINK_TABLE, links)
    data = RunData(result.summary, resolved, resolved_yaml, frame, links=links)
    write_report(data, out, html=res.scenario.output.html, chrome=frame is not None)
    text = json.dumps(result.summary, indent=2, sort_keys=False) + "\n"
    atomic_write_text(out / "summary.json", text)


class Executor(Protocol):
    """Runs tasks; yields each record as its point finishes."""

    description: str

    def run(self, tasks: Sequence[PointTask]) -> Iterator[dict[str, Any]]: ...

    def close(self) -> None: ...


def default_workers() -> int:
    """All the cores this process may use."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not on Linux
        return max(os.cpu_count() or 1, 1)


class LocalExecutor:
    """A process pool on this machine; one worker runs the points in this process."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or default_workers()
        self.description = f"local pool, {self.workers} worker{'s' * (self.workers != 1)}"
        self._pool: Any = None
        if self.workers > 1:
            from concurrent.futures import ProcessPoolExecutor

            # Import the simulator here first: forked workers then start with it loaded
            # instead of each importing it on its first point.
            import clustersim.sim  # noqa: F401

            self._pool = ProcessPoolExecutor(max_workers=self.workers)
            # Start the workers now, before this process runs other threads (the progress
            # bar's): forking a process with threads can copy a lock while it is held.
            self._pool.submit(os.getpid).result()

    def run(self, tasks: Sequence[PointTask]) -> Iterator[dict[str, Any]]:
        if self.workers == 1 or len(tasks) <= 1:
            for task in tasks:
                yield run_point(task)
            return
        from concurrent.futures import FIRST_COMPLETED, wait
        from concurrent.futures.process import BrokenProcessPool

        # A bounded window of submitted tasks: memory stays flat for huge studies.
        window = 4 * self.workers
        queue = iter(tasks)
        pending: dict[Any, PointTask] = {}

        def fill() -> None:
            for task in queue:
                pending[self._pool.submit(run_point, task)] = task
                if len(pending) >= window:
                    break

        fill()
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                task = pending.pop(fut)
                try:
                    yield fut.result()
                except BrokenProcessPool:
                    raise ClusterSimError(
                        "a worker process died (out of memory?); finished points are saved, "
                        "rerun the study to resume"
                    ) from None
            fill()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _import_distributed(option: str) -> Any:
    try:
        import distributed
    except ImportError:
        raise ScenarioError(
            option,
            MISSING,
            "Dask is not installed: pip install 'clustersim[dask]' (or distributed)",
        ) from None
    return distributed


class DaskExecutor:
    """Points as Dask tasks: on an existing scheduler, or a LocalCluster on loopback."""

    def __init__(
        self,
        scheduler: str | None = None,
        local_workers: int | None = None,
        *,
        processes: bool = True,
        connect_timeout_s: float = 20.0,
        window: int | None = None,
    ) -> None:
        distributed = _import_distributed("--scheduler" if scheduler else "--dask-local")
        self._cluster: Any = None
        self.client: Any = None
        if scheduler is not None:
            try:
                self.client = distributed.Client(scheduler, timeout=connect_timeout_s)
            except (OSError, TimeoutError, ValueError) as exc:
                raise ScenarioError(
                    "--scheduler", scheduler, f"cannot reach the Dask scheduler: {exc}"
                ) from None
            self.description = f"Dask scheduler {scheduler}"
        else:
            n = local_workers or default_workers()
            self._cluster = distributed.LocalCluster(
                n_workers=n,
                threads_per_worker=1,
                processes=processes,
                host="127.0.0.1",
                protocol="tcp",  # loopback TCP, also with threads (not in-process comms)
                dashboard_address=None,
                silence_logs=40,  # logging.ERROR
            )
            self.client = distributed.Client(self._cluster)
            self.description = f"Dask LocalCluster, {n} worker{'s' * (n != 1)}"
        self._distributed = distributed
        self._window = window

    def run(self, tasks: Sequence[PointTask]) -> Iterator[dict[str, Any]]:
        # A bounded window of tasks on the cluster (a few per worker thread), topped up
        # as points finish: the scheduler never holds a million-point study at once.
        threads = sum(self.client.nthreads().values()) or 1
        window = self._window or max(4 * threads, 16)
        queue = iter(tasks)
        futures: dict[Any, PointTask] = {}

        def submit(task: PointTask) -> Any:
            fut = self.client.submit(run_point, task, key=f"point-{task.id}", pure=False)
            futures[fut] = task
            return fut

        first = [submit(t) for _, t in zip(range(window), queue, strict=False)]
        pending = self._distributed.as_completed(first)
        for fut in pending:
            task = futures.pop(fut)
            try:
                record: dict[str, Any] = fut.result()
            except Exception as exc:  # a worker died (KilledWorker) or lost its data
                record = failed_record(task.id, f"Dask: {type(exc).__name__}: {exc}", "worker")
            fut.release()
            nxt = next(queue, None)
            if nxt is not None:
                pending.add(submit(nxt))
            yield record

    def close(self) -> None:
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()
