"""A serving run's requests before the simulation: when they arrive and how long they are.

``serving.arrival`` says when (:class:`~clustersim.scenario.serving.ArrivalCfg`):

- ``poisson``: exponential gaps at ``rate_per_s``, drawn inside the simulation;
- ``gamma``: gamma-distributed gaps of mean ``1 / rate_per_s`` and coefficient of
  variation ``cv`` (shape ``1 / cv^2``, scale ``cv^2 / rate``; ``cv = 1`` is the Poisson
  process, above 1 burstier), drawn with the generator ``default_rng([seed, 5])``;
- ``closed``: ``concurrency`` clients, each sending its next request when its last
  one finished, inside the simulation;
- ``trace``: the rows of a CSV, in the column layout of the public Azure LLM inference
  traces: ``timestamp`` (seconds, or ISO 8601 date-times), ``input_tokens`` and
  ``output_tokens`` (header names matched case-insensitively; Azure's
  ``TIMESTAMP, ContextTokens, GeneratedTokens`` are taken as the same three). The first
  row arrives at 0 and every later one at its offset from it; the lengths are the
  trace's. ``serving.requests``, when given, replays the first that many rows.

Lengths (``input_tokens``, ``output_tokens``) are a number, or drawn per request from a
lognormal, uniform or fixed distribution with the generators ``default_rng([seed, 1])``
and ``default_rng([seed, 2])``.

A trace that cannot be replayed as it is exits 2 naming ``serving.arrival.file`` and
the row: a missing column, a token count that is missing, not a whole number or below
1, a timestamp that is neither a number nor a date-time, timestamps out of order, or
more than :data:`MAX_TRACE_ROWS` rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from clustersim.errors import ScenarioError
from clustersim.scenario.serving import (
    FixedCfg,
    LengthValue,
    LognormalCfg,
    ServingCfg,
    UniformCfg,
    longest,
)

__all__ = ["MAX_TRACE_ROWS", "Workload", "gamma_times", "lengths", "read_trace", "workload"]

MAX_TRACE_ROWS = 10_000_000
COLUMNS = ("timestamp", "input_tokens", "output_tokens")
AZURE_NAMES = {"contexttokens": "input_tokens", "generatedtokens": "output_tokens"}
"""The Azure LLM inference traces' names for the token columns (lower-cased)."""
KEY = "serving.arrival.file"


@dataclass(frozen=True)
class Workload:
    """What :class:`~clustersim.serve.sim.ServeSim` is given: the arrival rule
    (``("poisson", rate)``, ``("closed", clients)`` or ``("times", 0)`` with ``times``),
    the requests and their lengths."""

    rule: tuple[str, float]
    times: list[float] | None
    requests: int
    inputs: int | list[int]
    outputs: int | list[int]
    longest_input: int
    longest_output: int


def lengths(length: LengthValue, count: int, seed: int, stream: int) -> int | list[int]:
    """The number, or ``count`` lengths drawn with the generator ``default_rng([seed,
    stream])`` (apart from the arrivals' own): a lognormal rounded and clipped to
    ``1..max``, or uniform integers ``min..max``."""
    if isinstance(length, int):
        return length
    if isinstance(length, FixedCfg):
        return length.tokens
    rng = np.random.default_rng([seed, stream])
    if isinstance(length, UniformCfg):
        return [int(n) for n in rng.integers(length.min, length.max, size=count, endpoint=True)]
    assert isinstance(length, LognormalCfg)
    drawn = rng.lognormal(math.log(length.median), length.sigma, size=count)
    return [int(n) for n in np.clip(np.rint(drawn), 1, length.max)]


def gamma_times(rate: float, cv: float, count: int, seed: int) -> list[float]:
    """``count`` arrival times whose gaps are gamma of mean ``1 / rate`` and
    coefficient of variation ``cv`` (the first after one gap, as Poisson's)."""
    rng = np.random.default_rng([seed, 5])
    gaps = rng.gamma(1.0 / cv**2, cv**2 / rate, size=count)
    return [float(t) for t in np.cumsum(gaps)]


def _row(index: int) -> str:
    return f"row {index + 2}"  # the file's line: a header, then rows from 1


def _tokens(frame: pd.DataFrame, column: str) -> list[int]:
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values) | (values < 1) | (values != np.floor(values))
    if bad.any():
        i = int(np.argmax(bad))
        raise ScenarioError(
            KEY, frame[column].iloc[i], f"{_row(i)}: {column} must be a whole number of at least 1"
        )
    return [int(v) for v in values]


def _seconds(column: pd.Series) -> np.ndarray:
    numbers = pd.to_numeric(column, errors="coerce").to_numpy(dtype=float)
    if np.isfinite(numbers).all():
        return numbers
    try:
        stamps = pd.to_datetime(column, format="ISO8601")
    except (ValueError, TypeError):
        stamps = None
    if stamps is None or stamps.isna().any():
        i = int(np.argmax(~np.isfinite(numbers)))
        raise ScenarioError(
            KEY, column.iloc[i], f"{_row(i)}: a timestamp must be seconds or an ISO 8601 date-time"
        )
    first = stamps.iloc[0]
    return np.asarray((stamps - first).dt.total_seconds(), dtype=float)


def _lines_over(path: str | Path, limit: int) -> bool:
    """Whether the file has more than ``limit`` lines, read in blocks (stopping as soon
    as it does), so an oversized trace is refused before it is parsed."""
    lines = 0
    with Path(path).open("rb") as f:
        while block := f.read(1 << 20):
            lines += block.count(b"\n")
            if lines > limit:
                return True
    return False


def read_trace(path: str | Path) -> tuple[list[float], list[int], list[int]]:
    """Arrival times (s from the first row), input and output tokens of a trace CSV."""
    try:
        if _lines_over(path, MAX_TRACE_ROWS + 1):  # the header, then the rows
            raise ScenarioError(KEY, str(path), f"more than {MAX_TRACE_ROWS:,} rows")
        frame = pd.read_csv(path, skipinitialspace=True)
    except FileNotFoundError:
        raise ScenarioError(KEY, str(path), "trace file not found") from None
    except (OSError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise ScenarioError(KEY, str(path), f"cannot read the trace as CSV: {exc}") from None
    except pd.errors.EmptyDataError:
        raise ScenarioError(KEY, str(path), "the trace is empty") from None
    if len(frame) > MAX_TRACE_ROWS:
        raise ScenarioError(KEY, str(path), f"more than {MAX_TRACE_ROWS:,} rows")
    if frame.empty:
        raise ScenarioError(KEY, str(path), "the trace has no rows")
    names = {c: str(c).strip().lower() for c in frame.columns}
    frame = frame.rename(columns={c: AZURE_NAMES.get(n, n) for c, n in names.items()})
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ScenarioError(
            KEY, str(path), f"missing column {', '.join(missing)} (needs {', '.join(COLUMNS)})"
        )
    times = _seconds(frame["timestamp"])
    back = np.diff(times) < 0
    if back.any():
        i = int(np.argmax(back)) + 1
        raise ScenarioError(
            KEY, frame["timestamp"].iloc[i], f"{_row(i)}: timestamps must not decrease"
        )
    offsets = [float(t) for t in times - times[0]]
    return offsets, _tokens(frame, "input_tokens"), _tokens(frame, "output_tokens")


def workload(cfg: ServingCfg, seed: int) -> Workload:
    """The run's arrival rule, requests and lengths (module doc); exit 2 on a bad trace."""
    arrival = cfg.arrival
    if arrival.kind == "trace":
        assert arrival.file is not None
        times, inputs, outputs = read_trace(arrival.file)
        n = len(times)
        if "requests" in cfg.model_fields_set:
            if cfg.requests > n:
                raise ScenarioError(
                    "serving.requests", cfg.requests, f"the trace holds only {n:,} requests"
                )
            n = cfg.requests
        return Workload(
            ("times", 0.0), times[:n], n, inputs[:n], outputs[:n], max(inputs[:n]), max(outputs[:n])
        )
    n = cfg.requests
    inputs_ = lengths(cfg.input_tokens, n, seed, 1)
    outputs_ = lengths(cfg.output_tokens, n, seed, 2)
    times_: list[float] | None = None
    if arrival.kind == "poisson":
        rule: tuple[str, float] = ("poisson", float(arrival.rate_per_s or 0))
    elif arrival.kind == "gamma":
        rule = ("times", 0.0)
        times_ = gamma_times(float(arrival.rate_per_s or 0), float(arrival.cv or 1), n, seed)
    else:
        rule = ("closed", float(arrival.concurrency or 1))
    return Workload(
        rule, times_, n, inputs_, outputs_, longest(cfg.input_tokens), longest(cfg.output_tokens)
    )
