"""How far a serving prediction may be off: the spread of the validation rows' errors.

Serving summaries carry no fitted interval: the serving runtimes are not calibrated
(the summary's ``software.note`` says so), so there are no residuals of a fit to
draw one from. What there is: the model's errors on published measurements
(:data:`clustersim.serve.references.ROWS`), each row's ``predicted / published - 1``
for TTFT and for TPOT. Per chip family (``trainium``: the inf2, trn1 and trn2 rows;
``gpu``: the H100 rows) they span ``[low, high]``, and a prediction ``P`` reads as a
measured value between ``P / (1 + high)`` and ``P / (1 + low)``: where the
measurement would fall if the model erred as the family's rows did, each way
(:mod:`clustersim.serve.bands`).

It is the range of the errors observed, not a confidence level: a handful of rows
(seven Trainium, two GPU), at batch 1 to 64 under closed loops, while a capacity
search runs Poisson load at larger batches.

Every serving summary carries it as ``uncertainty``, read from the errors shipped in
``clustersim/catalog/serving_errors.yaml``; ``python -m clustersim.serve.intervals
--write`` regenerates that file from a fresh prediction of every row, and a test holds
it current.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import yaml

from clustersim import catalog
from clustersim.serve.bands import ErrorBand, RowError
from clustersim.serve.bands import error_bands as bands_of
from clustersim.serve.references import ROWS, Row, predict

__all__ = ["ERRORS_FILE", "ErrorBand", "RowError", "error_bands", "errors_yaml", "row_errors"]

ERRORS_FILE = Path(__file__).resolve().parent.parent / "catalog" / "serving_errors.yaml"
DIGITS = 4


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
    """The error band of each chip family that has rows (default: fresh predictions)."""
    return bands_of(row_errors() if errors is None else errors)


def errors_yaml(errors: Sequence[RowError]) -> str:
    """The text of ``serving_errors.yaml`` for ``errors``."""
    head = (
        "# Each serving validation row's error, predicted p50 / published - 1 (TTFT, TPOT),\n"
        "# by chip family: what serving summaries' `uncertainty` reads\n"
        "# (clustersim.serve.bands). Regenerate with\n"
        "#   python -m clustersim.serve.intervals --write\n"
    )
    rows = {
        e.row: {"family": e.family, "ttft": round(e.ttft, DIGITS), "tpot": round(e.tpot, DIGITS)}
        for e in errors
    }
    return head + yaml.safe_dump({"rows": rows}, sort_keys=False, default_flow_style=None)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clustersim.serve.intervals")
    parser.add_argument("--write", action="store_true", help=f"rewrite {ERRORS_FILE.name}")
    args = parser.parse_args(argv)
    text = errors_yaml(row_errors())
    if args.write:
        ERRORS_FILE.write_text(text, encoding="utf-8")
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
