"""Analytic rows: one collective on a catalog instance against its alpha-beta closed form.

The closed forms (Thakur, Rabenseifner & Gropp 2005) take ``p`` ranks, ``n``
bytes, a per-step latency ``a`` and ``b`` seconds per byte of one direction of a
link. Both come from the catalog, not from the simulator: ``b = 1 / (link
bandwidth x the chip's link efficiency)``; ``a`` is the latency of one route,
which is the instance fabric's link latency both for a torus hop and for
chip-switch-chip through an NVSwitch (each switch link carries half of it).
"""

from __future__ import annotations

import math
import time

from clustersim import catalog
from clustersim.network.microbench import run_collective
from clustersim.validation.rows import CollectiveRef, Row

__all__ = ["closed_form_s", "run_collective_row"]


def closed_form_s(
    formula: str, op: str, p: int, n: float, *, a: float, b: float, dims: tuple[int, ...] = ()
) -> float:
    """Alpha-beta time of ``op`` over ``p`` ranks and ``n`` bytes.

    ``ring``: a one-way ring (or a bidirectional one through a switch, where both
    directions share each chip's links); ``ring_duplex``: half the buffer each way
    round a ring of duplex links; ``halving_doubling``: Rabenseifner's recursive
    halving then doubling; ``pairwise``: all-to-all in ``p - 1`` exchange rounds;
    ``torus``: bidirectional rings along each axis of ``dims`` in turn, each on
    the data left after the previous axes.
    """
    phases = 2 if op == "all_reduce" else 1
    frac = (p - 1) / p * n * b
    if formula == "ring":
        return phases * ((p - 1) * a + frac)
    if formula == "ring_duplex":
        return phases * ((p - 1) * a + frac / 2)
    if formula == "halving_doubling":
        return phases * (math.log2(p) * a + frac)
    if formula == "pairwise":
        return (p - 1) * a + frac
    if formula == "torus":
        t, m = 0.0, n
        for d in dims:
            if d >= 2:
                t += (d - 1) * a + (d - 1) / d * m * b / (2 if d > 2 else 1)
                m /= d
        return phases * t
    raise ValueError(f"unknown closed form {formula!r}")


def run_collective_row(ref: CollectiveRef) -> Row:
    """Simulate the collective once and compare with its closed form."""
    t0 = time.perf_counter()
    inst = catalog.instance(ref.instance)
    chip = catalog.chip(inst.chip)
    (sim,) = run_collective(
        ref.instance,
        ref.count,
        ref.op,
        [ref.size],
        algorithm=ref.algorithm,
        ranks=ref.ranks,
        overheads=False,
    )
    p = int(sim["ranks"])
    a = inst.fabric.link_latency_s
    b = 1.0 / (inst.fabric.link_bw_Bps * chip.calibration.link_efficiency)
    form = closed_form_s(ref.formula, ref.op, p, ref.size, a=a, b=b, dims=tuple(inst.fabric.dims))
    return Row(
        name=ref.name,
        kind="collective",
        metric=f"{ref.op} {ref.algorithm}",
        unit="s",
        published=form,
        predicted=float(sim["time_s"]),
        tolerance=ref.tolerance,
        source=ref.source,
        role="consistency",
        wall_s=time.perf_counter() - t0,
        extra={"ranks": p, "size_bytes": ref.size, "a_s": a, "b_s_per_byte": b},
    )
