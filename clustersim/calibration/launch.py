"""Fit the Neuron runtime's collective launch (``collectives.launch_s``) on the
Trainium calibration rows.

    python -m clustersim.calibration.launch                 # the default grid, 0 to 500 us
    python -m clustersim.calibration.launch --grid 300,350,400 --json

The measured collectives alone do not identify the launch
(:mod:`clustersim.validation.fit_collectives` holds it): nccom-test pays one launch
and a handshake per round for each collective, and any launch from 0 to 420 us,
traded against the handshakes, fits its sizes about equally well. What separates
them is a collective that pays the handshakes without the launch: one inside a
compiled program. A decode iteration at batch 1 on Neuron is one program whose time
is the weights' read and two all-reduces of a few KiB a layer, each a mesh of two
rounds, so the handshake is most of those rows' time beside the weights. At each
launch on the grid:

1. the other collective constants are fitted on the calibration rows of measured
   collectives (the nccom-test tables of trn1 and Trn2), the launch held there;
2. the family's calibrated constants are fitted on its calibration step rows as
   ``clustersim calibrate`` fits them: the estimate anchored on one simulation per
   row at the catalog's fit, with those collective constants;
3. the step rows are simulated again at the fitted constants, and the family's
   calibration serving rows (:data:`clustersim.serve.references.ROWS`, role
   ``calibration``: batch-1 TPOT) are served with those collective constants (a
   serving scenario runs on the chips' catalog constants, not a training fit).

The objective is the sum of squared log errors of the three (``joint``), and each
part. Holdouts are never read. One launch takes about 40 s of one core.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clustersim import catalog
from clustersim.calibration.command import anchored
from clustersim.calibration.fit import FitRow, fit_group, group_rows
from clustersim.catalog.fits import calibration, fit_overrides
from clustersim.scenario import Resolved, load_scenario
from clustersim.sim import simulate
from clustersim.validation import fit_collectives
from clustersim.validation.rows import references
from clustersim.validation.training import reference_stacks, scenario_text

__all__ = ["GRID_US", "Point", "main", "profile"]

GRID_US: tuple[float, ...] = (0, 60, 120, 210, 280, 320, 340, 360, 380, 400, 420, 500)
"""The default launches, in us: from zero to past where a ring step's handshake and a
halving-doubling round's coincide (420 us, the module doc of ``fit_collectives``);
above that the fit of the measured collectives drives the rounds' handshake to zero."""


@dataclass(frozen=True)
class Point:
    launch_s: float
    collectives: dict[str, float]
    constants: dict[str, float]
    collective_errors: dict[str, float]
    step_errors: dict[str, float]
    """Simulated step over published step, minus one, per calibration step row."""
    serving_errors: dict[str, float]
    """Predicted TPOT over published TPOT, minus one, per calibration serving row."""

    def sse(self, errors: dict[str, float]) -> float:
        return sum(math.log1p(e) ** 2 for e in errors.values())

    def as_dict(self) -> dict[str, Any]:
        coll, step = self.sse(self.collective_errors), self.sse(self.step_errors)
        serving = self.sse(self.serving_errors)
        return {
            "launch_us": self.launch_s * 1e6,
            "collectives": self.collectives,
            "constants": self.constants,
            "collective_rms": math.sqrt(  # of the relative errors, as fit_collectives prints
                sum(e * e for e in self.collective_errors.values()) / len(self.collective_errors)
            ),
            "collective_sse": coll,
            "step_errors": self.step_errors,
            "step_sse": step,
            "serving_errors": self.serving_errors,
            "serving_sse": serving,
            "joint_sse": coll + step + serving,
        }


def _step_s(res: Resolved) -> float:
    return float(simulate(res, record=False).summary["step_time_s"])


def profile(grid_us: Sequence[float] = GRID_US, family: str = "trainium") -> list[Point]:
    """The launch profile of ``family`` over ``grid_us`` (see the module doc)."""
    cal = calibration()
    groups = {k: v for k, v in group_rows(cal).items() if k.partition("/")[0] == family}
    if len(groups) != 1:
        raise ValueError(f"family {family!r} needs one fit group of step rows, has {len(groups)}")
    ((key, rows),) = groups.items()
    stacks = reference_stacks()
    texts = {r.name: scenario_text(r) for r in references().training}
    out = []
    for launch_us in grid_us:
        coll = fit_collectives.fit(family, held={"launch_s": launch_us * 1e-6})
        based = [
            FitRow(
                r.name,
                load_scenario(texts[r.name], _sets(coll.values, {}), stack_fit=False),
                r.measured_s,
            )
            for r in rows
        ]
        start = fit_overrides(rows[0].res.chip.name, stacks[rows[0].name], cal)
        use = anchored(based, cal, stacks)
        fitted = fit_group(key, use, cal.families[family], start=start).constants
        errors = {
            row.name: _step_s(
                load_scenario(texts[row.name], _sets(coll.values, fitted), stack_fit=False)
            )
            / row.measured_s
            - 1.0
            for row in rows
        }
        serving = serving_errors(family, coll.values)
        out.append(Point(launch_us * 1e-6, coll.values, fitted, coll.residuals, errors, serving))
    return out


def serving_errors(family: str, collectives: dict[str, float]) -> dict[str, float]:
    """Predicted TPOT over published, minus one, of the calibration serving rows on
    ``family``'s chips (a TPOT p50: one batch-1 decode iteration), with the collective
    constants ``collectives``. A serving scenario runs on the chips' catalog constants,
    not a training stack's fit (``scenario.load.resolve``), so only these change."""
    from clustersim.serve.references import ROWS, predict

    out = {}
    for row in ROWS:
        chip = catalog.chip(catalog.instance(row.instance).chip)
        if row.role == "calibration" and chip.family == family:
            _ttft, tpot = predict(row, sets=_sets(collectives, {}))
            out[f"{row.id} TPOT"] = tpot / row.tpot_ms - 1.0
    return out


def _sets(collectives: dict[str, float], constants: dict[str, float]) -> list[str]:
    sets = [f"cluster.chip.collectives.{k}={v!r}" for k, v in sorted(collectives.items())]
    return sets + [f"cluster.chip.calibration.{k}={v!r}" for k, v in sorted(constants.items())]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clustersim.calibration.launch")
    parser.add_argument("--family", default="trainium")
    parser.add_argument("--grid", help="launches in us, comma-separated (default 0 to 500)")
    parser.add_argument("--json", action="store_true", help="print the points as JSON")
    args = parser.parse_args(argv)
    try:
        grid = [float(x) for x in args.grid.split(",")] if args.grid else list(GRID_US)
    except ValueError:
        print(f"launch: --grid: not a list of numbers: {args.grid!r}", file=sys.stderr)
        return 2
    if any(g < 0 for g in grid):
        print(f"launch: --grid: launches cannot be negative: {args.grid!r}", file=sys.stderr)
        return 2
    points = profile(grid, args.family)
    if args.json:
        print(json.dumps([p.as_dict() for p in points], indent=2))
        return 0
    print(
        "launch    C1 and C3 rms  fitted constants  step rows  serving rows (TPOT)  "
        "sum of squared log errors (collectives, steps, serving: joint)"
    )
    for p in points:
        d = p.as_dict()
        consts = " ".join(f"{k} {v:.4f}" for k, v in p.constants.items())
        steps = " ".join(f"{k} {v:+.2%}" for k, v in p.step_errors.items())
        serving = " ".join(f"{k} {v:+.1%}" for k, v in p.serving_errors.items())
        print(
            f"{d['launch_us']:5.0f} us  {d['collective_rms']:.2%}  {consts}  {steps}  "
            f"{serving}  {d['collective_sse']:.5f}, {d['step_sse']:.5f}, "
            f"{d['serving_sse']:.5f}: {d['joint_sse']:.5f}"
        )
    best = min(points, key=lambda p: p.as_dict()["joint_sse"])
    print(f"least joint squares on this grid at {best.launch_s * 1e6:.0f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
