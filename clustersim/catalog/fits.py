"""Calibration data (``calibration.yaml``): declared constants, shipped fits, error bars.

    cal = calibration()                      # the shipped file, validated
    fam = family_of("h100")                  # "h100" (h100 and h200 share it)
    over = fit_overrides("h100", "nemo-24.07")   # {"tensor_efficiency": ..., ...} or {}
    fit_stack("megatron-bridge-25.11")       # "nemo-24.07": the stack it is fitted as

A stack may name a ``base`` (``stacks:`` in the file): the software it runs the
same kernels as. Its rows are fitted with the base's rows and run with the base's
fit, on every chip family; a chain of bases ends at the stack fitted.
    low, high, basis = interval("h100", 2.5)

``interval`` turns the calibration residuals of a chip family into an interval
around a predicted step time: with n calibration rows and k fitted constants
(dof = n - k), the residuals r (log of estimate over published) give
s = sqrt(sum r^2 / dof), and the 90% prediction interval is
``step x exp(+-t(0.95, dof) s sqrt(1 + 1/n))``. Fewer rows mean fewer degrees of
freedom and a wider interval. A family without residuals (no fit, or no
degree of freedom left) gets its declared ``default_spread``.
"""

from __future__ import annotations

import math
from functools import cache
from importlib import resources
from typing import Any

from pydantic import Field, ValidationError, model_validator

from clustersim.catalog.schema import Strict
from clustersim.catalog.shipped import load_yaml
from clustersim.errors import CatalogError

__all__ = [
    "CalibrationFile",
    "ConstantSpec",
    "Family",
    "Fit",
    "calibration",
    "family_of",
    "fit_overrides",
    "fit_stack",
    "interval",
    "overlaps",
    "residual_basis",
]


class ConstantSpec(Strict):
    bounds: tuple[float, float]
    what: str

    @model_validator(mode="after")
    def _ordered(self) -> ConstantSpec:
        if not self.bounds[0] < self.bounds[1]:
            raise ValueError(f"bounds {list(self.bounds)} must be [low, high] with low < high")
        return self


class Family(Strict):
    chips: tuple[str, ...]
    default_spread: float = Field(gt=0, lt=1)
    constants: dict[str, ConstantSpec]


class Fit(Strict):
    """One fitted family/stack: the values, when, on which rows, and how well."""

    constants: dict[str, float]
    previous: dict[str, float] = Field(default_factory=dict)
    fitted: str
    rows: tuple[str, ...]
    residuals: dict[str, float]
    rms: float
    simulated_residuals: dict[str, float] = Field(default_factory=dict)


class Stack(Strict):
    """A software stack fitted as another: ``base`` runs the same kernels (``why``)."""

    base: str = Field(min_length=1)
    why: str = Field(min_length=1)


class CalibrationFile(Strict):
    families: dict[str, Family]
    stacks: dict[str, Stack] = Field(default_factory=dict)
    fits: dict[str, Fit] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _fits_named(self) -> CalibrationFile:
        for key in self.fits:
            family, _, stack = key.partition("/")
            if family not in self.families or not stack:
                raise ValueError(f"fit {key!r} must be named family/stack of a declared family")
            if stack in self.stacks:
                raise ValueError(f"fit {key!r}: stack {stack!r} is fitted as its base")
        for start in self.stacks:  # every chain of bases ends
            name, seen = start, {start}
            while name in self.stacks:
                name = self.stacks[name].base
                if name in seen:
                    raise ValueError(f"stacks: the bases of {sorted(seen)} form a cycle")
                seen.add(name)
        return self


def parse_calibration(data: Any, where: str = "calibration") -> CalibrationFile:
    try:
        return CalibrationFile.model_validate(data)
    except ValidationError as exc:
        from clustersim.catalog import pydantic_error

        err = pydantic_error(exc, where)
        raise CatalogError(err.path, err.value, err.problem) from None


@cache
def calibration() -> CalibrationFile:
    """The shipped ``calibration.yaml``."""
    text = resources.files("clustersim.catalog").joinpath("calibration.yaml").read_text("utf-8")
    return parse_calibration(load_yaml(text))


def family_of(chip: str, cal: CalibrationFile | None = None) -> str | None:
    """The family whose constants cover ``chip``, or None."""
    cal = cal or calibration()
    for name, fam in cal.families.items():
        if chip in fam.chips:
            return name
    return None


def fit_stack(stack: str, cal: CalibrationFile | None = None) -> str:
    """The stack whose fit ``stack`` is fitted and run with: the end of its chain of bases."""
    cal = cal or calibration()
    while stack in cal.stacks:
        stack = cal.stacks[stack].base
    return stack


def fit_overrides(chip: str, stack: str, cal: CalibrationFile | None = None) -> dict[str, float]:
    """The fitted constants of ``chip``'s family for ``stack``: the fit of the stack it is
    fitted as (:func:`fit_stack`), else the family's pooled fit (``family/all``), else none."""
    cal = cal or calibration()
    family = family_of(chip, cal)
    if family is None:
        return {}
    key = f"{family}/{fit_stack(stack, cal)}"
    fit = cal.fits.get(key) or cal.fits.get(f"{family}/all")
    return dict(fit.constants) if fit is not None else {}


def residual_basis(family: str, cal: CalibrationFile | None = None) -> tuple[list[float], int]:
    """The calibration residuals of every fit of ``family`` and the constants fitted."""
    cal = cal or calibration()
    residuals: list[float] = []
    fitted = 0
    for key, fit in sorted(cal.fits.items()):
        if key.partition("/")[0] == family:
            residuals += list(fit.residuals.values())
            fitted += len(fit.constants)
    return residuals, fitted


def _t95(dof: int) -> float:
    """The 95th percentile of Student's t with ``dof`` degrees of freedom (what
    ``scipy.stats.t.ppf`` computes, without the seconds ``scipy.stats`` takes to import)."""
    from scipy.special import stdtrit

    return float(stdtrit(dof, 0.95))


def spread(residuals: list[float], fitted: int) -> float | None:
    """Half-width, in log space, of the 90% prediction interval; None without a dof."""
    n = len(residuals)
    dof = n - fitted
    if dof < 1:
        return None
    s = math.sqrt(sum(r * r for r in residuals) / dof)
    return _t95(dof) * s * math.sqrt(1 + 1 / n)


def interval(
    chip: str, step_s: float, cal: CalibrationFile | None = None
) -> tuple[float, float, str]:
    """(low, high, basis) of a predicted step time on ``chip``; see the module doc."""
    cal = cal or calibration()
    family = family_of(chip, cal)
    if family is None:
        half = 0.25
        return step_s / (1 + half), step_s * (1 + half), f"{chip}: no calibration family, ±25%"
    residuals, fitted = residual_basis(family, cal)
    half_log = spread(residuals, fitted)
    if half_log is None:
        d = cal.families[family].default_spread
        basis = f"{family}: no fitted residuals, declared default ±{d:.0%}"
        return step_s / (1 + d), step_s * (1 + d), basis
    n, dof = len(residuals), len(residuals) - fitted
    basis = f"{family}: 90% from {n} calibration rows, {dof} dof"
    return step_s * math.exp(-half_log), step_s * math.exp(half_log), basis


def overlaps(a: tuple[float, float] | list[float], b: tuple[float, float] | list[float]) -> bool:
    """Whether two intervals (low, high) overlap: then the model cannot tell them apart."""
    return a[0] <= b[1] and b[0] <= a[1]
