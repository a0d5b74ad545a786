"""Running benchmark cases, each in a fresh child process with a timeout and a memory cap.

The parent starts ``python -m clustersim.bench --case NAME`` and waits. The child
runs the case, then prints one line, ``RESULT_MARKER`` and a JSON object, with
its figures, its wall time (the case itself, not the interpreter's start) and
its peak resident memory read from inside. A case that raises reports its error
the same way; one that outlives ``timeout_s`` or ``max_rss_bytes`` is killed,
and the parent reports where it had got to and how much memory it held: the
last phase the case announced, and (on Unix) the Python stack it was in, which
the child dumps with ``faulthandler`` on ``SIGUSR1`` just before the kill.

Peak memory is the child's ``VmHWM`` (``/proc/self/status``), with
``getrusage(RUSAGE_SELF).ru_maxrss`` alongside: on Linux a process keeps the
``ru_maxrss`` of the process it was forked from across ``exec``, so a child of
a large parent would report at least the parent's peak. ``VmHWM`` belongs to
the child's own address space. Where there is no ``/proc`` ``ru_maxrss`` is used.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import json
import os
import platform
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from clustersim.bench.cases import CASES

__all__ = [
    "DEFAULT_MAX_RSS_BYTES",
    "DEFAULT_TIMEOUT_S",
    "RESULT_MARKER",
    "child_main",
    "machine_info",
    "peak_rss",
    "run_case",
    "run_cases",
]

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_MAX_RSS_BYTES = 8 * 2**30
"""A case whose resident memory passes this is stopped, so that the bench cannot
push a shared machine into swap or the OOM killer."""
RESULT_MARKER = "clustersim-bench-result: "
PHASE_MARKER = "clustersim-bench-phase: "
POLL_S = 0.1
STACK_WAIT_S = 0.5
_SIMULATING = "run (clustersim/sim/engine.py:"
"""A stack through ``StepSim.run`` is simulating, even before its first progress report."""
"""How long a stopped child gets to write its stack before it is killed."""
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


# -- memory and machine ---------------------------------------------------------------


def _proc_status(pid: int | str) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of a process, in bytes; empty without ``/proc``."""
    out: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text("ascii", errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[key] = int(parts[0]) * 1024  # the kernel writes kB (KiB)
    return out


def peak_rss() -> dict[str, int | None]:
    """This process's peak resident memory in bytes: ``vmhwm`` and ``ru_maxrss``."""
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return {"vmhwm": _proc_status("self").get("VmHWM"), "ru_maxrss": int(maxrss) * scale}


def machine_info() -> dict[str, Any]:
    """The CPU model, cores, memory and software versions of this machine."""
    import numpy
    import simpy

    from clustersim._version import __version__

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text("utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                cpu = value.strip()
                break
    except OSError:
        pass
    memory: int | None = None
    try:
        for line in Path("/proc/meminfo").read_text("ascii", errors="replace").splitlines():
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        memory = None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 0
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "memory_bytes": memory,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(terse=True),
        "simpy": getattr(simpy, "__version__", "?"),
        "numpy": numpy.__version__,
        "clustersim": __version__,
    }


# -- the child ------------------------------------------------------------------------


def child_main(argv: Sequence[str] | None = None) -> int:
    """``python -m clustersim.bench --case NAME``: run one case, print its result line."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m clustersim.bench")
    p.add_argument("--case", required=True, help=f"one of {', '.join(CASES)}")
    args = p.parse_args(argv)
    if hasattr(signal, "SIGUSR1"):  # the parent asks for the stack before stopping a case
        # Every Python thread: the kernel may hand a process-directed signal to any thread
        # that does not block it, such as one of OpenBLAS's workers, where a dump of the
        # "current" thread alone would hold no Python frame. The main thread, the oldest,
        # is dumped last, which is the dump ``_stack`` reads.
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)

    def phase(text: str) -> None:
        print(PHASE_MARKER + text, file=sys.stderr, flush=True)

    # Import the simulator before the clock starts: a case's wall time is its work,
    # not the interpreter loading NumPy and SimPy (``process_s`` has both).
    case = CASES.get(args.case)
    if case is None or case.preload:
        phase("importing clustersim")
        for module in ("clustersim.sim", "clustersim.scenario", "clustersim.network.microbench"):
            importlib.import_module(module)
    t0 = time.perf_counter()
    out: dict[str, Any] = {"case": args.case}
    code = 0
    try:
        if case is None:
            raise ValueError(f"unknown case {args.case!r}; valid: {', '.join(CASES)}")
        out["figures"] = case.run(phase)
        out["status"] = "ok"
    except Exception as exc:  # reported to the parent, never raised there
        traceback.print_exc()
        out["status"] = "failed"
        out["error"] = f"{type(exc).__name__}: {exc}"
        code = 1
    out["wall_s"] = time.perf_counter() - t0
    out["rss"] = peak_rss()
    print(RESULT_MARKER + json.dumps(out), flush=True)
    return code


# -- the parent -----------------------------------------------------------------------


def _child_env() -> dict[str, str]:
    """The environment of a child: this clustersim importable even from a bare checkout."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONHASHSEED", "0")
    return env


def _read(f: IO[str]) -> str:
    f.flush()
    f.seek(0)
    return f.read()


def _last_phase(stderr: str) -> str | None:
    phases = [ln[len(PHASE_MARKER) :] for ln in stderr.splitlines() if ln.startswith(PHASE_MARKER)]
    return phases[-1] if phases else None


def _short_path(path: str) -> str:
    for anchor in ("site-packages/", "clustersim/"):
        at = path.rfind(anchor)
        if at >= 0:
            return path[at + len(anchor) :] if anchor == "site-packages/" else path[at:]
    return Path(path).name


def _stack(stderr: str) -> list[str]:
    """The frames of the last ``faulthandler`` dump in ``stderr``, innermost first."""
    at = stderr.rfind("most recent call first")
    frames: list[str] = []
    for line in stderr[at:].splitlines()[1:] if at >= 0 else []:
        m = _FRAME.match(line)
        if m is None:
            break
        frames.append(f"{m['func']} ({_short_path(m['file'])}:{m['line']})")
    return frames


def _where(stack: list[str]) -> str | None:
    """The innermost frame, then the innermost clustersim frames that led to it."""
    if not stack:
        return None
    ours = [f for f in stack[1:] if "(clustersim/" in f and "(clustersim/bench/" not in f]
    return " < ".join([stack[0], *ours[:3]])


def _phase(stderr: str, stack: list[str]) -> str | None:
    phase = _last_phase(stderr)
    if any(f.startswith(_SIMULATING) for f in stack) and not (phase or "").startswith("simul"):
        return "simulating, before the first progress report"
    return phase


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ask the child for its stack, then kill it."""
    if hasattr(signal, "SIGUSR1"):
        with contextlib.suppress(OSError):
            proc.send_signal(signal.SIGUSR1)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STACK_WAIT_S)
    proc.kill()
    proc.wait()


def _last_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith(PHASE_MARKER)]
    return lines[-1].strip()[:300] if lines else "no output"


def run_case(
    name: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_rss_bytes: float = DEFAULT_MAX_RSS_BYTES,
    python: str = sys.executable,
) -> dict[str, Any]:
    """Run one case in a fresh child process; never raises for the case's own failures.

    Returns ``name``, ``status`` (``ok``, ``failed``, ``timeout`` or ``memory``),
    ``wall_s`` (the case in the child; for a stopped case, the time until it was
    stopped), ``process_s`` (the child's whole life, interpreter start included),
    ``peak_rss_bytes``, ``ru_maxrss_bytes``, ``error``, ``phase`` (the last
    phase a stopped case reported), ``where`` and ``stack`` (the Python frames it
    was in when stopped, innermost first), and ``figures``.
    """
    out: dict[str, Any] = {
        "name": name,
        "status": "failed",
        "wall_s": None,
        "process_s": None,
        "peak_rss_bytes": None,
        "ru_maxrss_bytes": None,
        "error": None,
        "phase": None,
        "where": None,
        "stack": [],
        "figures": {},
    }
    cmd = [python, "-m", "clustersim.bench", "--case", name]
    with (
        tempfile.TemporaryFile("w+", encoding="utf-8") as fout,
        tempfile.TemporaryFile("w+", encoding="utf-8") as ferr,
    ):
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(
                cmd, stdout=fout, stderr=ferr, stdin=subprocess.DEVNULL, env=_child_env()
            )
        except OSError as exc:
            out["error"] = f"could not start {python}: {exc}"
            return out
        status: dict[str, int] = {}
        stopped: str | None = None
        elapsed = 0.0
        try:
            while True:
                try:
                    proc.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                status = _proc_status(proc.pid) or status
                elapsed = time.perf_counter() - t0
                if elapsed >= timeout_s:
                    stopped = "timeout"
                elif status.get("VmRSS", 0) > max_rss_bytes:
                    stopped = "memory"
                if stopped:
                    status = _proc_status(proc.pid) or status
                    _stop(proc)
                    break
        finally:
            if proc.poll() is None:  # interrupted: never leave a child behind
                proc.kill()
                proc.wait()
        if stopped is None:
            elapsed = time.perf_counter() - t0
        stdout, stderr = _read(fout), _read(ferr)
    out["process_s"] = elapsed
    if stopped is not None:
        peak = status.get("VmHWM", status.get("VmRSS"))
        stack = _stack(stderr)
        out.update(
            status=stopped,
            wall_s=elapsed,
            peak_rss_bytes=peak,
            phase=_phase(stderr, stack),
            where=_where(stack),
            stack=stack,
        )
        if stopped == "timeout":
            out["error"] = f"did not finish in {timeout_s:g} s"
        else:
            cap = max_rss_bytes / 2**30
            out["error"] = f"stopped after {elapsed:.0f} s: resident memory over {cap:g} GiB"
        return out
    lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT_MARKER)]
    if not lines:
        out["error"] = f"exited with code {proc.returncode}: {_last_error_line(stderr)}"
        out["phase"] = _last_phase(stderr)
        return out
    child = json.loads(lines[-1][len(RESULT_MARKER) :])
    rss = child.get("rss", {})
    out.update(
        status=child.get("status", "failed"),
        wall_s=child.get("wall_s"),
        peak_rss_bytes=rss.get("vmhwm") or rss.get("ru_maxrss"),
        ru_maxrss_bytes=rss.get("ru_maxrss"),
        error=child.get("error"),
        figures=child.get("figures", {}),
    )
    if out["status"] != "ok":
        out["phase"] = _last_phase(stderr)
    return out


def compile_bytecode() -> bool:
    """Write the package's bytecode, as an installed package has it, so that a case run
    from a checkout whose modules were never imported, or with
    ``PYTHONDONTWRITEBYTECODE`` set, does not compile them inside its clock (about
    0.3 s of a CLI case's whole process). False where the folder cannot be written."""
    import compileall

    root = Path(__file__).resolve().parents[1]
    with contextlib.suppress(OSError):
        return bool(compileall.compile_dir(root, quiet=2, workers=1))
    return False


def run_cases(
    names: Sequence[str],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_rss_bytes: float = DEFAULT_MAX_RSS_BYTES,
    on_case: Callable[[int, int, dict[str, Any]], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Run ``names`` one after another (never two at once, so they do not share the CPU),
    the package's bytecode written first (:func:`compile_bytecode`)."""
    compile_bytecode()
    results: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(names):
        results[name] = run_case(name, timeout_s=timeout_s, max_rss_bytes=max_rss_bytes)
        if on_case is not None:
            on_case(i + 1, len(names), results[name])
    return results
