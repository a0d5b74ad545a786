"""Bounded least-squares fits of a chip family's declared constants.

The fit runs on the closed-form step estimate (``search.estimate``), which
agrees with the simulator within a few percent on the shipped scenarios and
reference rows, so one function evaluation costs milliseconds instead of a
simulation. Residuals are ``log(estimate / published)``: relative, and
symmetric between too fast and too slow.

Groups: the calibration rows of one chip family and software stack form a
group (``family/stack``); a stack with a declared base (``stacks:`` in
``calibration.yaml``) counts as its base. A stack with fewer than two calibration rows is
pooled with the family's other such rows into ``family/all``, the fit every
stack without its own falls back to. A group of n rows fits the first
``min(len(declared), n // 2)`` declared constants: at least two rows per
constant, so no constant is set by one row and every fit keeps as many degrees
of freedom as it fits constants. Hold-out rows are never read.

Leave-one-out (``leave_one_out``): the same constants are refitted on the group
without each row in turn, starting from the full fit, and the row left out is
predicted: ``e_i = log(estimate_(-i)(row i) / published)``. These out-of-sample
errors, not the in-sample residuals, make the intervals (``catalog.fits``). A
refit keeps the full fit's constants even where n - 1 rows would fit fewer: it
measures how well the model that ships predicts a row it did not see. For a fit
linear in one constant, ``e_i = r_i / (1 - h_ii)`` with ``h_ii = x_i^2 / sum x^2``
(the tests hold it to that closed form).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from clustersim.catalog.fits import (
    CalibrationFile,
    Family,
    Fit,
    calibration,
    family_of,
    fit_source,
    fit_stack,
)
from clustersim.catalog.schema import ChipSpec
from clustersim.hardware.chip import ChipModel
from clustersim.scenario import Resolved, load_scenario
from clustersim.search.estimate import Estimator, NetModel
from clustersim.workload import make_layout, model_flops_per_step

__all__ = [
    "POOLED",
    "FitResult",
    "FitRow",
    "estimate_s",
    "fit_group",
    "fit_references",
    "group_rows",
    "leave_one_out",
    "prior_rows",
    "with_constants",
]

POOLED = "all"
"""The stack name of a family's pooled fit."""


@dataclass(frozen=True)
class FitRow:
    """One measured step: a resolved scenario and its measured (published) step time."""

    name: str
    res: Resolved
    measured_s: float


@dataclass
class FitResult:
    key: str
    constants: dict[str, float]
    previous: dict[str, float]
    rows: list[str]
    residuals: dict[str, float]
    before: dict[str, float] = field(default_factory=dict)
    loo: dict[str, float] = field(default_factory=dict)

    @property
    def rms(self) -> float:
        r = list(self.residuals.values())
        return math.sqrt(sum(x * x for x in r) / len(r)) if r else 0.0

    def as_fit(self, date: str | None = None) -> Fit:
        return Fit(
            constants={k: round(v, 6) for k, v in self.constants.items()},
            previous=self.previous,
            fitted=date or datetime.now(UTC).date().isoformat(),
            rows=tuple(self.rows),
            residuals={k: round(v, 6) for k, v in self.residuals.items()},
            loo_residuals={k: round(v, 6) for k, v in self.loo.items()},
            rms=round(self.rms, 6),
        )


def with_constants(chip: ChipSpec, values: dict[str, float]) -> ChipSpec:
    """``chip`` with its calibration fields replaced by ``values``."""
    cal = chip.calibration.model_copy(update=values)
    return chip.model_copy(update={"calibration": cal})


def estimate_s(res: Resolved, chip: ChipSpec | None = None) -> float:
    """The closed-form step time of ``res``'s own layout, on ``chip`` if given."""
    chip = chip or res.chip
    sc = res.scenario
    layout = make_layout(sc.parallelism, res.ranks, res.ranks_per_chip, res.ranks_per_node)
    model = ChipModel(chip, res.lnc)
    net = NetModel.of(res.instance, chip, sc.cluster.count, res.lnc)
    return Estimator(res.model, sc.training, model, net)(sc.parallelism, layout).step_time_s


Estimate = Callable[[Resolved, ChipSpec], float]


def _previous(rows: Sequence[FitRow], family: Family) -> dict[str, float]:
    """The catalog's values of the family's constants, from the first row's chip."""
    if not rows:
        return {}
    base = rows[0].res.chip.calibration
    unset = {"attention_backward_efficiency": 1.0}  # the forward's rate when not set
    return {
        n: float(
            getattr(base, n)
            if getattr(base, n) is not None
            else unset.get(n, base.tensor_efficiency)
        )
        for n in family.constants
    }


def _log_errors(rows: Sequence[FitRow], vals: dict[str, float], estimate: Estimate) -> np.ndarray:
    return np.array(
        [math.log(estimate(r.res, with_constants(r.res.chip, vals)) / r.measured_s) for r in rows]
    )


def _solve(
    rows: Sequence[FitRow],
    family: Family,
    names: list[str],
    x0: dict[str, float],
    estimate: Estimate,
    *,
    tol: float = 1e-10,
) -> dict[str, float]:
    """All of ``x0``, with ``names`` fitted on ``rows`` by bounded least squares, to a
    relative step ``tol`` of the constants (``ftol`` and ``gtol`` a hundredth of it)."""
    from scipy.optimize import least_squares

    if not names:
        return dict(x0)

    def values(x: np.ndarray) -> dict[str, float]:
        return {**x0, **{n: float(v) for n, v in zip(names, x, strict=True)}}

    def errors(x: np.ndarray) -> np.ndarray:
        return _log_errors(rows, values(x), estimate)

    lo = np.array([family.constants[n].bounds[0] for n in names])
    hi = np.array([family.constants[n].bounds[1] for n in names])
    x_init = np.clip(np.array([x0[n] for n in names]), lo, hi)
    sol = least_squares(
        errors, x_init, bounds=(lo, hi),
        x_scale=hi - lo, diff_step=np.full(len(names), 1e-4),
        xtol=tol, ftol=tol / 100, gtol=tol / 100, method="trf",
    )  # fmt: skip
    return values(sol.x)


def fit_group(
    key: str,
    rows: Sequence[FitRow],
    family: Family,
    *,
    start: dict[str, float] | None = None,
    estimate: Estimate = estimate_s,
) -> FitResult:
    """Fit the group's constants on ``rows`` (see the module doc)."""
    names = list(family.constants)[: min(len(family.constants), len(rows) // 2)]
    previous = _previous(rows, family)
    # Only the fitted constants are set; the others keep each row's chip values, so one
    # the catalog leaves unset (attention_efficiency: tensor_efficiency's) follows the
    # fitted one in the estimate as it does in the simulator.
    x0 = {
        **{n: previous[n] for n in names},
        **{n: v for n, v in (start or {}).items() if n in names},
    }
    before = _log_errors(rows, x0, estimate)
    vals = _solve(rows, family, names, x0, estimate)
    final = _log_errors(rows, vals, estimate)
    return FitResult(
        key=key,
        constants={n: vals[n] for n in names},
        previous={n: previous[n] for n in names},
        rows=[r.name for r in rows],
        residuals={r.name: float(v) for r, v in zip(rows, final, strict=True)},
        before={r.name: float(v) for r, v in zip(rows, before, strict=True)},
    )


def leave_one_out(
    result: FitResult,
    rows: Sequence[FitRow],
    family: Family,
    *,
    estimate: Estimate = estimate_s,
) -> dict[str, float]:
    """Per row, the log error of its prediction by ``result``'s constants refitted on the
    other rows (see the module doc); ``result.loo`` is set to it."""
    names = list(result.constants)
    x0 = dict(result.constants)  # the others keep each row's chip values, as in fit_group
    out: dict[str, float] = {}
    for i, row in enumerate(rows):
        others = [r for k, r in enumerate(rows) if k != i]
        vals = _solve(others, family, names, x0, estimate, tol=1e-6)  # from the full fit
        out[row.name] = float(_log_errors([row], vals, estimate)[0])
    result.loo = out
    return out


def group_rows(cal: CalibrationFile | None = None) -> dict[str, list[FitRow]]:
    """The shipped calibration rows by fit group (``family/stack``); hold-outs never read,
    nor the rows of a stack that runs on a prior's fit (``prior`` in calibration.yaml:
    its ``why`` says what the model cannot fit them by)."""
    from clustersim.validation.rows import references
    from clustersim.validation.training import published_step_s, reference_stacks, scenario_text

    cal = cal or calibration()
    stacks = reference_stacks()
    by_stack: dict[tuple[str, str], list[FitRow]] = {}
    for ref in references().training:
        if ref.role != "calibration":
            continue
        res = load_scenario(scenario_text(ref), stack_fit=False)  # the catalog's constants
        family = family_of(res.chip.name, cal)
        if family is None:
            continue
        chip = ChipModel(res.chip, res.lnc)
        peak = chip.peak_flops(res.scenario.training.precision) * res.chips
        flops = model_flops_per_step(res.model, res.scenario.training)
        measured = published_step_s(ref.published, res, flops, peak)
        stack = fit_stack(stacks[ref.name], cal)
        if stack in cal.stacks and cal.stacks[stack].prior is not None:
            continue
        by_stack.setdefault((family, stack), []).append(FitRow(ref.name, res, measured))
    groups: dict[str, list[FitRow]] = {}
    for (family, stack), rows in sorted(by_stack.items()):
        key = f"{family}/{stack}" if len(rows) >= 2 else f"{family}/{POOLED}"
        groups.setdefault(key, []).extend(rows)
    return {k: v for k, v in groups.items() if len(v) >= 2}


def prior_rows(cal: CalibrationFile | None = None) -> dict[str, tuple[str, str]]:
    """The calibration rows no fit group holds that run with a fit all the same (their
    family's prior's, or their stack's prior's): per row, (its chip, the fit
    ``family/stack`` it borrows from)."""
    from clustersim.validation.rows import references
    from clustersim.validation.training import reference_stacks, scenario_text

    cal = cal or calibration()
    stacks = reference_stacks()
    grouped = {r.name for rows in group_rows(cal).values() for r in rows}
    out: dict[str, tuple[str, str]] = {}
    for ref in references().training:
        if ref.role != "calibration" or ref.name in grouped:
            continue
        chip = load_scenario(scenario_text(ref), stack_fit=False).chip.name
        key = fit_source(chip, stacks[ref.name], cal)
        if family_of(chip, cal) is not None and key is not None:
            out[ref.name] = (chip, key)
    return out


def fit_references(cal: CalibrationFile | None = None) -> list[FitResult]:
    """Fit every group of the shipped calibration rows."""
    cal = cal or calibration()
    out = []
    for key, rows in group_rows(cal).items():
        family = cal.families[key.partition("/")[0]]
        out.append(fit_group(key, rows, family))
    return out
