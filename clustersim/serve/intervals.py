"""How far a serving prediction may be off: the spread of the validation rows' errors.

Serving summaries carry no fitted interval: the serving runtimes are not calibrated
(the summary's ``software.note`` says so), so there are no residuals of a fit to
draw one from. What there is: the model's errors on published measurements
(:data:`clustersim.serve.references.ROWS`), each row's ``predicted / published - 1``
for TTFT and for TPOT. Per chip family (``trainium``: the inf2, trn1 and trn2 rows;
``gpu``: the H100 rows) they span ``[low, high]``, and a prediction ``P`` reads as a
measured value between ``P / (1 + high)`` and ``P / (1 + low)``: where the
measurement would fall if the model erred as the family's rows did, each way.

It is the range of the errors observed, not a confidence level: a handful of rows
(seven Trainium, two GPU), at batch 1 to 64 under closed loops, while a capacity
search runs Poisson load at larger batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from clustersim import catalog
from clustersim.serve.references import ROWS, Row, predict

__all__ = ["ErrorBand", "RowError", "error_bands", "row_errors"]

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


def family_of(instance: str) -> str:
    return catalog.chip(catalog.instance(instance).chip).family


def row_errors(rows: Sequence[Row] = ROWS) -> list[RowError]:
    """Each row predicted (:func:`~clustersim.serve.references.predict`) against its
    publication."""
    out = []
    for row in rows:
        ttft_ms, tpot_ms = predict(row)
        out.append(
            RowError(
                row.id,
                family_of(row.instance),
                ttft_ms / row.ttft_ms - 1.0,
                tpot_ms / row.tpot_ms - 1.0,
            )
        )
    return out


def error_bands(errors: Sequence[RowError] | None = None) -> dict[str, ErrorBand]:
    """The error band of each chip family that has rows."""
    errors = row_errors() if errors is None else errors
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
