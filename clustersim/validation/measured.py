"""Measured collectives: nccom-test and nccl-tests figures against the simulator.

Each reference (``measured_collectives`` in ``references.yaml``) is one collective
on a catalog instance at several sizes, as the benchmark printed it: bus bandwidth
per size, or a time (the small-message floor). Each size becomes a :class:`Row`
named ``NAME@SIZE``, compared in time (busbw and time are inverse at a fixed size,
so the relative error of one is minus that of the other, to first order).

The simulator runs with the runtime's fixed costs (the chip's ``collectives``
block), which :mod:`clustersim.validation.fit_collectives` fits on the rows whose
``role`` is ``calibration``.
"""

from __future__ import annotations

import time
from typing import Any

from clustersim.network.microbench import busbw_factor, run_collective
from clustersim.units import format_bytes
from clustersim.validation.rows import MeasuredCollectiveRef, MeasuredPoint, Row

__all__ = ["measured_rows", "point_time_s", "simulate"]


def point_time_s(ref: MeasuredCollectiveRef, point: MeasuredPoint, ranks: int) -> float:
    """The measured time of ``point``, from its time or its bus bandwidth."""
    if point.time_s is not None:
        return point.time_s
    assert point.busbw_GBps is not None  # one of the two, by validation
    return point.size * busbw_factor(ref.op, ranks) / (point.busbw_GBps * 1e9)


def simulate(
    ref: MeasuredCollectiveRef, chip: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The simulator's rows for every size of ``ref``, with chip overrides ``chip``."""
    return run_collective(
        ref.instance,
        ref.count,
        ref.op,
        [p.size for p in ref.points],
        algorithm=ref.algorithm,
        ranks=ref.ranks,
        lnc=ref.lnc,
        chip=chip,
    )


def measured_rows(ref: MeasuredCollectiveRef) -> list[Row]:
    """One row per measured size: published and predicted time."""
    t0 = time.perf_counter()
    sims = simulate(ref)
    wall = (time.perf_counter() - t0) / len(sims)
    rows = []
    for point, sim in zip(ref.points, sims, strict=True):
        p = int(sim["ranks"])
        measured = point_time_s(ref, point, p)
        what = "time" if point.time_s is not None else "busbw"
        rows.append(
            Row(
                name=f"{ref.name}@{format_bytes(point.size)}",
                kind="collective",
                metric=f"{ref.op} {what} ({sim['algorithm']})",
                unit="s",
                published=measured,
                predicted=float(sim["time_s"]),
                tolerance=point.tolerance or ref.tolerance,
                source=ref.source,
                role=ref.role,
                note=point.note or ref.note,
                wall_s=wall,
                extra={
                    "ranks": p,
                    "size_bytes": point.size,
                    "busbw_published_GBps": point.size * busbw_factor(ref.op, p) / measured / 1e9,
                    "busbw_predicted_GBps": float(sim["busbw_GBps"]),
                    "protocol": str(sim["protocol"]),
                },
            )
        )
    return rows
