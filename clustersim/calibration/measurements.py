"""Users' own measurements: nccl-tests and nccom-test output, and measured step times.

    points = parse_nccl_tests(text, "all_reduce.txt")      # [CollectivePoint, ...]
    points = parse_nccom_test(text, "allr.txt")
    steps = parse_step_times(text, "steps.csv")             # [(scenario path, seconds)]

Both collective tools print a table with one row per message size. nccl-tests
(``NVIDIA/nccl-tests``, ``doc/PERFORMANCE.md``) prints comment lines starting
with ``#``, a two-line header naming the columns (``size count type redop root
time algbw busbw #wrong`` for out-of-place, then the same for in-place; older
releases have no ``root``), and rows of numbers; ``# Avg bus bandwidth`` ends
it. nccom-test (``aws-neuron-sdk:tools/neuron-sys-tools/nccom-test.rst``) prints
a header ``size(B) count(elems) type time(us) algbw(GB/s) busbw(GB/s)`` and one
row per size. The out-of-place time (the first ``time`` column) is taken.

A malformed file raises :class:`~clustersim.errors.ScenarioError` naming the
file and the line number, so the command exits 2 with one line.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

from clustersim.errors import ScenarioError

__all__ = [
    "OPS",
    "CollectivePoint",
    "op_from_name",
    "parse_nccl_tests",
    "parse_nccom_test",
    "parse_step_times",
]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")

# Names the tools and their users give each collective (binary names, nccom-test verbs).
_ALIASES = {
    "all_reduce": ("all_reduce", "allreduce", "allr"),
    "all_gather": ("all_gather", "allgather", "allg"),
    "reduce_scatter": ("reduce_scatter", "reducescatter", "redsct"),
    "all_to_all": ("all_to_all", "alltoall", "alltoall_perf", "a2a"),
}


@dataclass(frozen=True)
class CollectivePoint:
    """One measured collective: ``op`` over ``ranks`` ranks on ``size_bytes``."""

    op: str
    size_bytes: float
    time_s: float
    busbw_Bps: float
    ranks: int | None
    source: str
    line: int


def op_from_name(name: str) -> str | None:
    """The collective a file or argument names (``all_reduce_perf.txt`` -> all_reduce)."""
    low = name.lower().replace("-", "_")
    for op, aliases in _ALIASES.items():
        if any(a in low for a in aliases):
            return op
    return None


def _bad(source: str, line: int, problem: str, value: object = None) -> ScenarioError:
    return ScenarioError(f"{source}:{line}", value if value is not None else "", problem)


def _number(text: str, source: str, line: int, column: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _bad(source, line, f"column {column!r} is not a number", text) from None
    if not math.isfinite(value) or value < 0:
        raise _bad(source, line, f"column {column!r} must be a finite number >= 0", text)
    return value


def _table(
    text: str, source: str, header_has: tuple[str, ...], comment: str | None
) -> list[tuple[int, dict[str, str]]]:
    """Rows of the tool's table as (line number, {column: text}), with the header's names."""
    columns: list[str] | None = None
    rows: list[tuple[int, dict[str, str]]] = []
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        body = line.lstrip("#").strip() if comment and line.startswith(comment) else None
        if body is not None:
            words = body.split()
            if columns is None and all(any(w.startswith(h) for w in words) for h in header_has):
                columns = [w.split("(")[0].lower() for w in words]
            continue
        if columns is None:
            if all(h in line for h in header_has):  # nccom-test: the header is not a comment
                columns = [w.split("(")[0].split(":")[0].lower() for w in line.split()]
                continue
            if comment is None and not line[0].isdigit():
                continue  # nccom-test prints its command line and notes before the table
            raise _bad(source, no, f"a table row before the header ({' '.join(header_has)})", line)
        if not line[0].isdigit():
            if comment is None:
                continue  # trailing summary (``Avg bus bandwidth: ...``)
            raise _bad(source, no, "expected a row of numbers or a '#' comment", line)
        words = line.split()
        if len(words) < len(columns):
            need = len(columns)
            raise _bad(source, no, f"a row of {len(words)} fields; the header has {need}", line)
        row: dict[str, str] = {}
        for name, word in zip(columns, words, strict=False):
            row.setdefault(name, word)  # the first of a repeated name: out-of-place
        rows.append((no, row))
    if columns is None:
        raise _bad(source, 1, f"no table header (a line naming {', '.join(header_has)})")
    if not rows:
        raise _bad(source, 1, "the table has no rows")
    return rows


def _points(
    rows: list[tuple[int, dict[str, str]]], op: str, ranks: int | None, source: str
) -> list[CollectivePoint]:
    out = []
    for no, row in rows:
        for col in ("size", "time", "busbw"):
            if col not in row:
                raise _bad(source, no, f"no {col!r} column in the header")
        size = _number(row["size"], source, no, "size")
        time_us = _number(row["time"], source, no, "time")
        busbw = _number(row["busbw"], source, no, "busbw")
        if size <= 0 or time_us <= 0:
            raise _bad(source, no, "size and time must be positive", f"{size:g} B, {time_us:g} us")
        out.append(CollectivePoint(op, size, time_us * 1e-6, busbw * 1e9, ranks, source, no))
    return out


def parse_nccl_tests(text: str, source: str, op: str | None = None) -> list[CollectivePoint]:
    """The out-of-place rows of an nccl-tests ``*_perf`` output (see the module doc)."""
    op = op or op_from_name(source)
    if op is None:
        raise _bad(source, 1, f"cannot tell the collective; name it OP=FILE ({', '.join(OPS)})")
    ranks = sum(1 for ln in text.splitlines() if ln.lstrip("#").strip().startswith("Rank "))
    rows = _table(text, source, ("size", "time", "busbw"), comment="#")
    return _points(rows, op, ranks or None, source)


def parse_nccom_test(text: str, source: str, op: str | None = None) -> list[CollectivePoint]:
    """The rows of an nccom-test output (see the module doc); ranks from ``-r N``."""
    op = op or op_from_name(source) or _nccom_verb(text)
    if op is None:
        raise _bad(source, 1, f"cannot tell the collective; name it OP=FILE ({', '.join(OPS)})")
    ranks = None
    for ln in text.splitlines():
        words = ln.split()
        if "nccom-test" in ln and "-r" in words and words.index("-r") + 1 < len(words):
            value = words[words.index("-r") + 1]
            ranks = int(value) if value.isdigit() else None
    rows = _table(text, source, ("size", "time", "busbw"), comment=None)
    return _points(rows, op, ranks, source)


def _nccom_verb(text: str) -> str | None:
    for ln in text.splitlines():
        if "nccom-test" in ln:
            return op_from_name(ln.split()[-1])
    return None


def parse_step_times(text: str, source: str) -> list[tuple[Path, float]]:
    """A CSV with columns ``scenario,step_time_s``: scenario paths relative to the CSV."""
    base = Path(source).parent
    reader = csv.reader(io.StringIO(text))
    out: list[tuple[Path, float]] = []
    header: list[str] | None = None
    for no, fields in enumerate(reader, start=1):
        if not fields or all(not f.strip() for f in fields) or fields[0].startswith("#"):
            continue
        if header is None:
            header = [f.strip() for f in fields]
            if header[:2] != ["scenario", "step_time_s"]:
                raise _bad(source, no, "the header must start scenario,step_time_s", fields)
            continue
        if len(fields) < 2:
            raise _bad(source, no, "a row needs a scenario and a step time", fields)
        seconds = _number(fields[1].strip(), source, no, "step_time_s")
        if seconds <= 0:
            raise _bad(source, no, "step_time_s must be positive", fields[1])
        out.append((base / fields[0].strip(), seconds))
    if not out:
        raise _bad(source, 1, "no rows (expected a header scenario,step_time_s and rows)")
    return out
