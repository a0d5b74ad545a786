"""The work guard: estimate a run's events and memory before building anything big.

A scenario can be valid and still ask for more than a laptop can simulate in
detail (a global batch of 10^8 sequences, a thousand steps of a 512-rank job).
Such a run is refused up front with the estimate and a remedy, instead of
thrashing the machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.errors import ScenarioError
from clustersim.scenario import Resolved
from clustersim.units import format_bytes

__all__ = ["Estimate", "Limits", "check_work", "estimate"]

# Instructions per layer per microbatch on one rank, measured on the lowered
# programs: about 43 with selective recompute, 57 with full recompute (the
# forward's ops and TP collectives run twice). Rounded up so the estimate is an
# upper bound.
_OPS_PER_LAYER = {"none": 45, "selective": 50, "full": 64}
_OPS_PER_MICROBATCH = 40  # embedding, head, loss, sends and receives
_BYTES_PER_OP = 16  # two float64 times per segment while simulating
_BYTES_PER_TRACE_ROW = 64  # the trace DataFrame and its Parquet encoding
_BYTES_PER_PROGRAM_OP = 200  # an Instr object and its share of the program


@dataclass(frozen=True)
class Limits:
    """What one run may use. The defaults suit a laptop with 8 GiB to spare."""

    max_events: float = 60e6
    max_memory_bytes: float = 8 * 2**30


@dataclass(frozen=True)
class Estimate:
    events: float
    memory_bytes: float
    ops_per_rank: float


def estimate(res: Resolved, dp: int, *, trace: bool, folded: bool = False) -> Estimate:
    sc = res.scenario
    par, train = sc.parallelism, sc.training
    microbatches = max(train.global_batch_size // max(dp * par.microbatch_size, 1), 1)
    layers = -(-res.model.layers // par.pp)
    per_rank = microbatches * (layers * _OPS_PER_LAYER[par.recompute] + _OPS_PER_MICROBATCH)
    events = per_rank * (par.pp if folded else res.ranks) * train.steps
    memory = per_rank * par.pp * _BYTES_PER_PROGRAM_OP + events * _BYTES_PER_OP
    if trace:
        memory += events * _BYTES_PER_TRACE_ROW
    return Estimate(float(events), float(memory), float(per_rank))


def check_work(res: Resolved, dp: int, limits: Limits, *, folded: bool = False) -> Estimate:
    """Refuse a run whose estimate exceeds ``limits``; return the estimate otherwise."""
    trace = res.scenario.output.trace
    est = estimate(res, dp, trace=trace, folded=folded)
    remedy = (
        ("" if folded else "use --fidelity folded, ")
        + "lower training.steps or training.global_batch_size, raise "
        "parallelism.microbatch_size, or raise the limit (--max-events, --max-memory)"
    )
    if est.events > limits.max_events:
        raise ScenarioError(
            "training",
            f"{est.events:.3g} events",
            f"this run would simulate about {est.events:.3g} events, over the limit of "
            f"{limits.max_events:.3g}; {remedy}",
        )
    if est.memory_bytes > limits.max_memory_bytes:
        hint = "set output.trace: false, or " if trace else ""
        raise ScenarioError(
            "training",
            format_bytes(est.memory_bytes),
            f"this run would need about {format_bytes(est.memory_bytes)} of memory, over the "
            f"limit of {format_bytes(limits.max_memory_bytes)}; {hint}{remedy}",
        )
    return est
