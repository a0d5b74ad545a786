"""Serving references: published p50 TTFT and TPOT, and throughput at maximum load,
against ``clustersim serve``.

Each reference (``serving`` in ``references.yaml``) names a row of
:data:`clustersim.serve.references.ROWS`, which holds the setup as its source ran it
(instance, model, TP, engine rules, batch or concurrency, prompt and output lengths)
and the published p50 figures. It becomes two :class:`Row`\\ s, ``NAME@ttft`` and
``NAME@tpot``, each with its own tolerance; a metric the reference lists in ``gaps``
is a known gap, reported and never failing. A throughput reference (a row of
:data:`~clustersim.serve.references.THROUGHPUT_ROWS`) becomes one row,
``NAME@throughput``: output tokens per second with every request sent at once. The
role must be the row's own (the Transformers-NeuronX rows at batch 1 enter the fit of
the Neuron runtime's collective launch, :mod:`clustersim.calibration.launch`; the
others are held out).
"""

from __future__ import annotations

import time

from clustersim.errors import CatalogError
from clustersim.serve.references import ROWS, THROUGHPUT_ROWS, predict, predict_throughput
from clustersim.validation.rows import Row, ServingRef

__all__ = ["run_serving_rows"]


def run_serving_rows(ref: ServingRef) -> list[Row]:
    """The reference's TTFT and TPOT rows, or its throughput row (module doc)."""
    found = [r for r in ROWS if r.id == ref.id]
    if not found:
        if any(r.id == ref.id for r in THROUGHPUT_ROWS):
            return [_throughput_row(ref)]
        raise CatalogError(f"references.serving.{ref.name}.id", ref.id, "no such serving row")
    row = found[0]
    t0 = time.perf_counter()
    ttft_ms, tpot_ms = predict(row)
    wall = time.perf_counter() - t0
    setup = (
        f"{row.instance}, {row.model}, TP{row.tp}, concurrency {row.concurrency}, "
        f"{row.input_tokens}/{row.output_tokens}"
    )
    out = []
    for metric, published, predicted, tolerance in (
        ("ttft", row.ttft_ms, ttft_ms, ref.tolerance_ttft),
        ("tpot", row.tpot_ms, tpot_ms, ref.tolerance_tpot),
    ):
        gap = ref.gaps.get(metric, "")  # type: ignore[call-overload]
        out.append(
            Row(
                name=f"{ref.name}@{metric}",
                kind="serving",
                metric=f"p50 {metric.upper()}",
                unit="s",
                published=published / 1e3,
                predicted=predicted / 1e3,
                tolerance=tolerance,
                source=ref.source,
                role=ref.role,
                status="known_gap" if gap else "checked",
                gap=gap,
                wall_s=wall / 2,
                extra={"id": row.id, "setup": setup},
            )
        )
    return out


def _throughput_row(ref: ServingRef) -> Row:
    (row,) = (r for r in THROUGHPUT_ROWS if r.id == ref.id)
    t0 = time.perf_counter()
    predicted = predict_throughput(row)
    gap = ref.gaps.get("throughput", "")
    return Row(
        name=f"{ref.name}@throughput",
        kind="serving",
        metric="output tokens/s",
        unit="tok/s",
        published=row.output_tokens_per_s,
        predicted=predicted,
        tolerance=ref.tolerance_throughput,
        source=ref.source,
        role=ref.role,
        status="known_gap" if gap else "checked",
        gap=gap,
        wall_s=time.perf_counter() - t0,
        extra={
            "id": row.id,
            "setup": f"{row.instance}, {row.model}, TP{row.tp}, {row.requests} requests at "
            f"once, {row.input_tokens}/{row.output_tokens}",
        },
    )
