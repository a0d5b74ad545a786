"""Run the CLI in-process on one hostile case, with a time and memory cap, and check
the bad-input contract: exit 2 (or 0 if the input happens to be valid), exactly one
line on stderr that names where the problem is, never a traceback or an internal
error."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import resource
import shutil
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from clustersim.cli import main

CASE_SECONDS = 10.0
"""A case that takes longer is stopped and fails: hostile input must be refused fast."""
CASE_MEMORY_BYTES = 1 * 2**30
"""Most a case may raise the process's peak memory by."""
_ADDRESS_SPACE_HEADROOM = 6 * 2**30
"""Virtual memory a case may add before allocations fail (MemoryError beats the OOM killer)."""

ERROR_LINE = re.compile(r"clustersim: error: (?P<where>\S(?:.*?\S)??): (?P<problem>\S.*)")


class CaseTimeout(BaseException):
    """Raised in the case by a timer; a BaseException so ``main`` does not swallow it."""


@dataclass
class Outcome:
    args: list[str]
    rc: int
    out: str
    err: str
    seconds: float
    rss_growth_bytes: int
    runtime_warnings: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return (
            f"clustersim {' '.join(self.args)[:300]!r} -> exit {self.rc} in {self.seconds:.2f} s, "
            f"peak memory +{self.rss_growth_bytes / 2**20:.0f} MiB\n"
            f"stderr: {self.err[:2000]!r}\nwarnings: {self.runtime_warnings[:5]}"
        )


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # KiB on Linux


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    def expire(_signum: int, _frame: FrameType | None) -> None:
        raise CaseTimeout(f"case ran over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _address_space_limit(headroom: int) -> Iterator[None]:
    """Cap virtual memory at its current size plus ``headroom`` (Linux only)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = pages * resource.getpagesize() + headroom
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def run_cli(args: Sequence[str]) -> Outcome:
    """``clustersim ARGS`` in this process, with stdout, stderr and warnings captured."""
    out, err = io.StringIO(), io.StringIO()
    rss0 = _peak_rss_bytes()
    t0 = time.perf_counter()
    with (
        warnings.catch_warnings(record=True) as caught,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        _address_space_limit(_ADDRESS_SPACE_HEADROOM),
        _time_limit(CASE_SECONDS),
    ):
        warnings.simplefilter("always")
        try:
            rc = main(list(args))
        except SystemExit as exc:  # argparse usage errors
            rc = exc.code if isinstance(exc.code, int) else 1
    seconds = time.perf_counter() - t0
    numeric = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    return Outcome(
        list(args), rc, out.getvalue(), err.getvalue(), seconds, _peak_rss_bytes() - rss0, numeric
    )


def assert_contract(o: Outcome) -> str | None:
    """Check the bad-input contract; return the key path named on an error, or None."""
    assert o.seconds < CASE_SECONDS, str(o)
    assert o.rss_growth_bytes < CASE_MEMORY_BYTES, str(o)
    assert "Traceback" not in o.err and "Traceback" not in o.out, str(o)
    assert "internal error" not in o.err, str(o)
    assert o.rc in (0, 2), str(o)
    if o.rc == 0:
        assert o.err == "", str(o)
        assert not o.runtime_warnings, str(o)  # overflow or NaN on a valid input
        return None
    lines = o.err.splitlines()
    assert len(lines) == 1 and o.err.endswith("\n"), str(o)
    match = ERROR_LINE.fullmatch(lines[0])
    assert match is not None, str(o)
    return match["where"]


@contextlib.contextmanager
def case_dir() -> Iterator[Path]:
    """A fresh directory per example (Hypothesis does not mix with function fixtures)."""
    path = Path(tempfile.mkdtemp(prefix="clustersim-hostile-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def write(directory: Path, content: str | bytes, name: str = "scenario.yaml") -> Path:
    path = directory / name
    if isinstance(content, str):
        content = content.encode("utf-8", "surrogatepass")
    path.write_bytes(content)
    return path


def check_summary(out_dir: Path) -> dict[str, Any]:
    """The run's summary.json, which must exist and hold only finite numbers."""

    def finite(value: Any) -> None:
        if isinstance(value, float):
            assert math.isfinite(value), value
        elif isinstance(value, dict):
            for v in value.values():
                finite(v)
        elif isinstance(value, list):
            for v in value:
                finite(v)

    def refuse(constant: str) -> float:
        raise AssertionError(f"summary.json holds {constant}")

    summary: dict[str, Any] = json.loads(
        (out_dir / "summary.json").read_text(), parse_constant=refuse
    )
    finite(summary)
    return summary
