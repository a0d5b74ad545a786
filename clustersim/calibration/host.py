"""Fit a software stack's host cost per op (``host_op_s``) on its own calibration rows.

    python -m clustersim.calibration.host            # fit, print, compare with the shipped
    python -m clustersim.calibration.host --write    # and write it to calibration.yaml
    python -m clustersim.calibration.host --check    # exit 1 where the shipped value is stale

A host that issues a rank's program one op after another, ahead of the device
(``software.host_op_s``, :mod:`clustersim.sim.engine`), sets the step where it is slower
than the device. Only a stack whose calibration rows are host-bound identifies it: the
stacks that declare ``host_op_s`` in ``catalog/calibration.yaml`` (a stack running on a
prior's efficiencies, whose rows stay out of the device constants' fit). Each is fitted
alone: the least squares of the log errors of its calibration rows' simulated step times
(the whole simulation, as ``validate`` runs them), bounded by the range
:data:`PLAUSIBLE_S` states; holdouts are never read. The fit is a bounded scalar
minimisation (scipy's ``minimize_scalar``); a fit that lands on a bound fails ``--check``,
as a constant pressing on its ceiling fails ``calibrate --check``.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from scipy.optimize import minimize_scalar

from clustersim.catalog.fits import calibration, fit_stack
from clustersim.scenario import load_scenario
from clustersim.sim.result import Result
from clustersim.sim.run import simulate
from clustersim.validation.rows import TrainingRef, references
from clustersim.validation.training import published_step_s, reference_stacks, scenario_text

__all__ = ["PLAUSIBLE_S", "HostFit", "fit_host", "host_rows", "main"]

PLAUSIBLE_S = (10e-6, 500e-6)
"""The range a host may take per modelled op: each is one to a few PyTorch ops (a linear,
an attention core's softmax with its scale, mask and dropout), each through its Python
module, PyTorch's dispatcher and, under PyTorch/XLA, the lazy tensor's IR; from a few
microseconds per op for an eager launch to a few hundred for a traced one. A stated
bound, not a measurement: no published profile of a host's time per op was found."""
CALIBRATION = Path(__file__).resolve().parents[1] / "catalog" / "calibration.yaml"
DIGITS = 4
"""Significant figures written (the fit's tolerance is finer)."""


@dataclass(frozen=True)
class HostFit:
    stack: str
    host_op_s: float
    rows: tuple[str, ...]
    residuals: dict[str, float]
    """log(predicted / published) per row at the fitted value."""

    @property
    def rms(self) -> float:
        vals = list(self.residuals.values())
        return math.sqrt(sum(v * v for v in vals) / len(vals)) if vals else 0.0

    @property
    def at_bound(self) -> bool:
        lo, hi = PLAUSIBLE_S
        return not lo * 1.01 < self.host_op_s < hi * 0.99


def host_stacks() -> list[str]:
    """The stacks whose host cost is fitted: those that declare ``host_op_s``."""
    return sorted(n for n, s in calibration().stacks.items() if s.host_op_s is not None)


def host_rows(stack: str) -> list[TrainingRef]:
    """The calibration rows that run ``stack`` (or a release of it)."""
    stacks = reference_stacks()
    return [
        ref
        for ref in references().training
        if ref.role == "calibration" and fit_stack(stacks[ref.name]) == stack
    ]


def _log_error(ref: TrainingRef, host_op_s: float) -> float:
    res = load_scenario(scenario_text(ref), [f"software.host_op_s={host_op_s!r}"])
    result = simulate(res, record=False)
    assert isinstance(result, Result)
    s = result.summary
    peak = result.plan.chip.peak_flops(res.scenario.training.precision) * res.chips
    published = published_step_s(ref.published, res, float(s["model_flops_per_step"]), peak)
    return math.log(float(s["step_time_s"]) / published)


def fit_host(stack: str) -> HostFit:
    """``stack``'s host cost per op, fitted on its calibration rows (module doc)."""
    rows = host_rows(stack)
    if len(rows) < 2:
        raise ValueError(f"{stack}: {len(rows)} calibration rows; a fit needs two")

    def objective(log_h: float) -> float:
        h = math.exp(log_h)
        return sum(_log_error(ref, h) ** 2 for ref in rows)

    lo, hi = PLAUSIBLE_S
    found = minimize_scalar(
        objective, bounds=(math.log(lo), math.log(hi)), method="bounded", options={"xatol": 1e-4}
    )
    h = float(f"{math.exp(found.x):.{DIGITS}g}")
    residuals = {ref.name: round(_log_error(ref, h), 6) for ref in rows}
    return HostFit(stack, h, tuple(r.name for r in rows), residuals)


def write(fit: HostFit, path: Path = CALIBRATION) -> None:
    """Set the stack's ``host_op_s`` in ``calibration.yaml`` (its comments kept)."""
    text = path.read_text()
    entry = re.search(rf"^  {re.escape(fit.stack)}:\n((?:    .*\n)+)", text, flags=re.M)
    if entry is None:
        raise ValueError(f"{path}: no stack {fit.stack!r}")
    body, n = re.subn(
        r"^    host_op_s: .*$", f"    host_op_s: {fit.host_op_s!r}", entry.group(1), flags=re.M
    )
    if n != 1:
        raise ValueError(f"{path}: stack {fit.stack!r} declares no host_op_s")
    path.write_text(text[: entry.start(1)] + body + text[entry.end(1) :])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m clustersim.calibration.host", description=__doc__)
    ap.add_argument("--write", action="store_true", help="write the fitted values")
    ap.add_argument("--check", action="store_true", help="exit 1 where the shipped value differs")
    args = ap.parse_args(argv)
    stale = 0
    for stack in host_stacks():
        fit = fit_host(stack)
        shipped = calibration().stacks[stack].host_op_s or 0.0
        rows = ", ".join(f"{n} {v:+.3f}" for n, v in fit.residuals.items())
        print(
            f"{stack}: host_op_s {fit.host_op_s * 1e6:.1f} us (shipped {shipped * 1e6:.1f} us)"
            f" on {len(fit.rows)} rows, rms log error {fit.rms:.3f}: {rows}"
        )
        if fit.at_bound:
            print(f"{stack}: host_op_s presses on its plausible range {PLAUSIBLE_S}")
            stale += 1
        if not math.isclose(fit.host_op_s, shipped, rel_tol=10.0 ** (1 - DIGITS)):
            if args.write:
                write(fit)
            else:
                stale += 1
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
