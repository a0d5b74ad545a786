"""Running the references, in this process or in worker processes (``validate --jobs N``).

Each reference is one task: a training row, a collective row, a measured collective
(a row per size), a reliability row or a serving reference (its TTFT and TPOT rows,
or its throughput row). With one job the tasks run here, one after another, in the
file's order. With ``N`` jobs each task runs in a process of its own, at most ``N`` at
once, forked from this one (so it starts with everything this process has imported
and loaded, and its peak memory is the task's alone); the longest tasks start first
(the static hints ``TrainingRef.cost_s`` and ``ServingRef.cost_s``) so that the
workers finish together. A run is deterministic, so the rows come out the same in
either mode, to the last bit, and are put back in the file's order.

A task that raises stops the run with that task's exception, as a serial run does:
the other workers are ended, and the exception is raised here (with the worker's
traceback as its cause). A worker that dies (killed, out of memory) ends the run with
a :class:`~clustersim.errors.ClusterSimError` naming the reference.

Forking needs this process to have no other threads (a fork copies only the calling
thread, and a lock another thread held stays held in the child): progress is
reported through ``progress`` calls from this thread, which draw on demand.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from clustersim.errors import ClusterSimError
from clustersim.validation.analytic import run_collective_row
from clustersim.validation.measured import measured_rows
from clustersim.validation.reliability import run_reliability_row
from clustersim.validation.rows import (
    CollectiveRef,
    MeasuredCollectiveRef,
    ReliabilityRef,
    Row,
    ServingRef,
    TrainingRef,
)
from clustersim.validation.serving import run_serving_rows
from clustersim.validation.training import run_training

__all__ = ["Progress", "Reference", "Status", "default_jobs", "run_reference", "run_references"]

Reference = TrainingRef | CollectiveRef | MeasuredCollectiveRef | ReliabilityRef | ServingRef

TICK_S = 1.0
"""How often a parallel run reports progress while no task finishes."""


def default_jobs() -> int:
    """The CPUs this process may use (at least one)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not on Linux
        return max(os.cpu_count() or 1, 1)


def run_reference(ref: Reference) -> list[Row]:
    """The rows of one reference (one, one per size of a measured collective, or a
    serving reference's TTFT and TPOT)."""
    if isinstance(ref, TrainingRef):
        return [run_training(ref)]
    if isinstance(ref, CollectiveRef):
        return [run_collective_row(ref)]
    if isinstance(ref, MeasuredCollectiveRef):
        return measured_rows(ref)
    if isinstance(ref, ServingRef):
        return run_serving_rows(ref)
    return [run_reliability_row(ref)]


def _cost_s(ref: Reference) -> float:
    return ref.cost_s if isinstance(ref, TrainingRef | ServingRef) else 0.0


@dataclass
class Status:
    """Where a run stands, passed to ``progress`` whenever it changes (and each second
    of a parallel run): tasks done of ``total``, the running ones with the
    ``time.perf_counter()`` they started at, and the task that just finished
    (``finished``, its wall time and its process's peak resident memory in bytes;
    the peak is 0 in a serial run, where the tasks share this process)."""

    total: int
    jobs: int
    done: int = 0
    running: dict[str, float] = field(default_factory=dict)
    finished: str | None = None
    finished_wall_s: float = 0.0
    finished_peak_bytes: int = 0


Progress = Callable[[Status], None]


def run_references(
    refs: Sequence[Reference], *, jobs: int = 1, progress: Progress | None = None
) -> list[Row]:
    """The rows of ``refs``, in their order: here (``jobs`` 1) or in worker processes."""
    jobs = max(1, min(jobs, len(refs)))
    status = Status(total=len(refs), jobs=jobs)
    if jobs == 1:
        return _serial(refs, status, progress)
    return _parallel(refs, status, progress)


def _serial(refs: Sequence[Reference], status: Status, progress: Progress | None) -> list[Row]:
    rows: list[Row] = []
    for ref in refs:
        t0 = time.perf_counter()
        status.running = {ref.name: t0}
        status.finished = None
        if progress is not None:
            progress(status)
        rows.extend(run_reference(ref))
        status.done += 1
        status.running = {}
        status.finished, status.finished_wall_s = ref.name, time.perf_counter() - t0
        if progress is not None:
            progress(status)
    return rows


class _ChildTracebackError(Exception):
    """The traceback of an exception raised in a worker, as text (its ``__cause__``)."""

    def __str__(self) -> str:
        return str(self.args[0])


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else one with its message and exit code."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        if isinstance(exc, ClusterSimError):
            out = ClusterSimError(str(exc))
            out.exit_code = exc.exit_code
            return out
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _child(conn: Connection, ref: Reference) -> None:
    """A worker: run one reference, send back its rows (or its exception) and peak."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    result: tuple[list[Row] | None, BaseException | None, str]
    try:
        result = (run_reference(ref), None, "")
    except Exception as exc:
        result = (None, _portable(exc), traceback.format_exc())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak *= 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    conn.send((*result, peak))
    conn.close()


def _context() -> Any:
    """Fork where it is safe and cheap (Linux), spawn elsewhere."""
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    return multiprocessing.get_context(method)


@dataclass
class _Running:
    index: int
    ref: Reference
    process: Any
    t0: float


def _parallel(refs: Sequence[Reference], status: Status, progress: Progress | None) -> list[Row]:
    ctx = _context()
    order = sorted(range(len(refs)), key=lambda i: -_cost_s(refs[i]))  # stable: ties in order
    queue = list(reversed(order))  # pop() takes the costliest
    results: dict[int, list[Row]] = {}
    running: dict[Connection, _Running] = {}

    def start() -> None:
        index = queue.pop()
        ref = refs[index]
        here, there = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(there, ref), name=f"validate {ref.name}")
        proc.start()
        there.close()  # the child's end: closed here, so its exit reads as end of file
        running[here] = _Running(index, ref, proc, time.perf_counter())

    def report(finished: _Running | None = None, peak: int = 0) -> None:
        status.running = {r.ref.name: r.t0 for r in running.values()}
        if finished is not None:
            status.finished = finished.ref.name
            status.finished_wall_s = time.perf_counter() - finished.t0
            status.finished_peak_bytes = peak
        else:
            status.finished = None
        if progress is not None:
            progress(status)

    try:
        while queue or running:
            while queue and len(running) < status.jobs:
                start()
                report()
            ready = wait(list(running), timeout=TICK_S)
            if not ready:
                report()  # the running tasks' times move on
            for conn in ready:
                assert isinstance(conn, Connection)
                task = running.pop(conn)
                try:
                    rows, exc, tb, peak = conn.recv()
                except EOFError:
                    task.process.join()
                    raise ClusterSimError(
                        f"validate: the worker running {task.ref.name} died "
                        f"(exit code {task.process.exitcode}; out of memory?)"
                    ) from None
                conn.close()
                task.process.join()
                if exc is not None:
                    raise exc from _ChildTracebackError(tb)
                results[task.index] = rows
                status.done += 1
                report(task, peak)
    finally:
        for task in running.values():  # an error, or Ctrl-C: end the other workers
            task.process.terminate()
        for task in running.values():
            task.process.join()
    return [row for i in range(len(refs)) for row in results[i]]
