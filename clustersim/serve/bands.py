"""Serving error bands: the range of the validation rows' errors, per chip family.

Each published serving row's error is ``predicted / published - 1`` for TTFT and for
TPOT (:mod:`clustersim.serve.intervals` predicts them). Per chip family the errors
span ``[low, high]``, and a prediction ``P`` reads as a measured value between
``P / (1 + high)`` and ``P / (1 + low)``: where the measurement would fall if the
model erred as the family's rows did, each way. Every serving summary carries that
interval of its p50 TTFT and TPOT as ``uncertainty`` (:func:`uncertainty`), read from
the errors shipped in ``clustersim/catalog/serving_errors.yaml`` rather than predicted
again per run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal

import yaml

__all__ = ["ErrorBand", "Metric", "RowError", "error_bands", "shipped_errors", "uncertainty"]

Metric = Literal["ttft", "tpot"]


@dataclass(frozen=True)
class RowError:
    row: str
    family: str
    ttft: float
    """predicted / published - 1, of the p50 TTFT."""
    tpot: float


@dataclass(frozen=True)
class ErrorBand:
    """The lowest and highest error of a chip family's rows, for TTFT and TPOT."""

    family: str
    rows: tuple[str, ...]
    ttft: tuple[float, float]
    tpot: tuple[float, float]

    def interval(self, metric: Metric, predicted: float) -> tuple[float, float]:
        """Where the measured value of ``predicted`` falls if the model errs as these
        rows did: ``(P / (1 + high), P / (1 + low))``."""
        low, high = self.ttft if metric == "ttft" else self.tpot
        return predicted / (1.0 + high), predicted / (1.0 + low)


def error_bands(errors: Sequence[RowError]) -> dict[str, ErrorBand]:
    """The error band of each chip family that has rows."""
    bands = {}
    for family in sorted({e.family for e in errors}):
        mine = [e for e in errors if e.family == family]
        ttft = [e.ttft for e in mine]
        tpot = [e.tpot for e in mine]
        bands[family] = ErrorBand(
            family,
            tuple(e.row for e in mine),
            (min(ttft), max(ttft)),
            (min(tpot), max(tpot)),
        )
    return bands


@cache
def shipped_errors() -> tuple[RowError, ...]:
    """The rows' errors as shipped in ``catalog/serving_errors.yaml``."""
    text = resources.files("clustersim.catalog").joinpath("serving_errors.yaml").read_text()
    data = yaml.safe_load(text)
    return tuple(
        RowError(row, str(e["family"]), float(e["ttft"]), float(e["tpot"]))
        for row, e in data["rows"].items()
    )


def uncertainty(family: str, ttft_p50_s: float | None, tpot_p50_s: float | None) -> dict[str, Any]:
    """A serving summary's ``uncertainty``: where the measured p50 TTFT and TPOT fall if
    the model errs as its chip family's published rows did (the band's interval), or
    None for a value or a family without one."""
    band = error_bands(shipped_errors()).get(family)

    def one(metric: Metric, value: float | None) -> list[float] | None:
        if band is None or value is None:
            return None
        return list(band.interval(metric, value))

    return {
        "basis": "the range of this chip family's serving validation rows' errors "
        f"({', '.join(band.rows) if band else 'none'}): a range, not a confidence level",
        "ttft_p50_s": one("ttft", ttft_p50_s),
        "tpot_p50_s": one("tpot", tpot_p50_s),
    }
