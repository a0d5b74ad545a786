"""Calibration data (``calibration.yaml``): declared constants, shipped fits, error bars.

    cal = calibration()                      # the shipped file, validated
    fam = family_of("h100")                  # "h100" (h100 and h200 share it)
    over = fit_overrides("h100", "megatron-core")  # {"attention_efficiency": ...} or {}
    fit_stack("megatron-bridge-25.11")       # "megatron-core": the stack it is fitted as
    fit_overrides("b200", "megatron-core")   # h100's fitted efficiencies (b200's prior)
    fit_overrides("h100", "torchtitan")      # megatron-core's efficiencies (its prior stack)

A stack may name a ``base`` (``stacks:`` in the file): the software it runs the
same kernels as. Its rows are fitted with the base's rows and run with the base's
fit, on every chip family; a chain of bases ends at the stack fitted. A stack
with no run to fit names a ``prior`` stack instead and runs on its fitted
efficiencies, its interval widened by its declared ``prior_spread``.
    low, high, basis = interval("h100", 2.5)

``interval`` turns the leave-one-out residuals of a chip family into a 90%
prediction interval around a predicted step time. ``clustersim calibrate`` refits
each group once without each of its n rows in turn and predicts the row left out:
e_i = log(estimate_(-i) / published), an out-of-sample error (no constant it is
judged by was fitted on it), unlike the in-sample residuals r_i, which understate
a new row's error (for a least-squares fit linear in its constants
e_i = r_i / (1 - h_ii), h_ii the row's leverage). Each e_i is already the error of
a prediction from fitted constants, so their root mean square
s = sqrt(sum e_i^2 / n) estimates the prediction error's spread, constant
uncertainty included (no sqrt(1 + 1/n) factor), and the model's half-width is
t(0.95, n - 1) s: Student's t for a spread measured on n errors, counted with
n - 1 degrees of freedom rather than n because the errors are not independent
(any two left-out fits share n - 2 rows), the conservative count of a sample of
n about its mean. The errors of a family's fits (``family/stack``) are pooled.
A published figure is itself noisy between releases of its source
(``reference_noise`` per family, with its source line in ``calibration.yaml``). That
drift moves the rows of a release together, so a fit absorbs it into its constants
and the residuals cannot see it; it is independent of them and joins in quadrature:
half = sqrt((t s)^2 + log(1 + noise)^2), and the interval is ``step x exp(+-half)``.
Fewer rows mean fewer degrees of freedom and a wider interval. A family with fewer
than two left-out residuals takes its declared ``default_spread`` as the model's
half-width, ``log(1 + default)``, joined with its reference noise the same way.

No family's model half-width is narrower than the pooled one: t(0.95, N - 1) S
over the N left-out residuals of every family together (:func:`pooled_spread`).
A family's own rows say little about its error on a run unlike them: the A100's
come from one table of one paper on one cluster, with layouts alike, so their
spread measures how alike they are more than how wrong the model is on another
run. The mechanisms the model lacks are shared by every family (one simulator
prices every chip), so the left-out errors of all the families together are the
better estimate where a family's own are fewer and more alike; a family whose own
spread is wider keeps it (the floor is built from calibration rows' residuals only).
"""

from __future__ import annotations

import math
from functools import cache
from importlib import resources
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from clustersim.catalog.schema import Strict
from clustersim.catalog.shipped import load_yaml
from clustersim.errors import CatalogError

__all__ = [
    "CEILING_MARGIN",
    "CalibrationFile",
    "Ceiling",
    "ConstantSpec",
    "Family",
    "Fit",
    "ReferenceNoise",
    "calibration",
    "ceiling_problems",
    "family_of",
    "fit_overrides",
    "fit_source",
    "fit_stack",
    "half_width",
    "interval",
    "model_spread",
    "overlaps",
    "pooled_spread",
    "residual_basis",
    "spread",
]


class Ceiling(Strict):
    """The physical ceiling of a constant: the best measured kernel of its kind on the
    family's chips (``value``), and where that measurement is (``source``)."""

    value: float = Field(gt=0)
    source: str = Field(min_length=1)


CEILING_MARGIN = 0.005
"""A fitted constant within this relative distance of its ceiling presses on it."""


class ConstantSpec(Strict):
    bounds: tuple[float, float]
    what: str
    ceiling: Ceiling | None = None

    @model_validator(mode="after")
    def _ordered(self) -> ConstantSpec:
        if not self.bounds[0] < self.bounds[1]:
            raise ValueError(f"bounds {list(self.bounds)} must be [low, high] with low < high")
        if self.ceiling is not None and self.bounds[1] > self.ceiling.value:
            raise ValueError(
                f"bounds {list(self.bounds)} reach above the ceiling {self.ceiling.value}"
            )
        return self

    def presses(self, value: float) -> bool:
        """Whether ``value`` is at (or past) this constant's ceiling."""
        return self.ceiling is not None and value >= self.ceiling.value * (1 - CEILING_MARGIN)


class ReferenceNoise(Strict):
    """How far a family's published figures move between releases of their source:
    ``spread`` is the relative half-width read as a 90% band, ``source`` where it is stated."""

    spread: float = Field(ge=0, lt=1)
    source: str = Field(min_length=1)


class Transfer(Strict):
    """How a family's fits, made on rows of one of its chips, reach its other chips:
    their efficiencies scaled by the engine model's (``hardware.kernel_tiling``) ratio of
    what one matmul of ``shape`` (m, k, n) sustains on each chip, so the generations'
    clocks, DMA rates and SBUF sizes carry over and the fitted remainder (what the
    compiler leaves of the best kernel) stays the same."""

    fitted_on: str
    shape: tuple[int, int, int]
    source: str = Field(min_length=1)


class Family(Strict):
    chips: tuple[str, ...]
    transfer: Transfer | None = None
    """Where the family's rows ran on one chip only: how its fits reach the others."""
    default_spread: float = Field(gt=0, lt=1)
    reference_noise: ReferenceNoise
    constants: dict[str, ConstantSpec]
    prior: str | None = None
    """The family whose fitted efficiencies this one takes where it has no fit of its own."""
    ceilings: dict[str, Ceiling] = Field(default_factory=dict)
    """Ceilings of constants the family declares but does not fit (a catalog value, or a
    constant a kernel table now measures): no chip of the family may exceed them."""
    default_stack: str

    def ceiling(self, name: str) -> Ceiling | None:
        """The ceiling of ``name``, fitted or declared; None if it has none."""
        spec = self.constants.get(name)
        return spec.ceiling if spec is not None and spec.ceiling else self.ceilings.get(name)

    """The software stack a scenario on these chips runs when it names none."""


PRIOR_SUFFIX = "_efficiency"
"""The constants a prior lends: dimensionless efficiencies (fractions of a peak)."""


class Fit(Strict):
    """One fitted family/stack: the values, when, on which rows, and how well: in sample
    (``residuals``) and with each row left out of the fit in turn (``loo_residuals``)."""

    constants: dict[str, float]
    previous: dict[str, float] = Field(default_factory=dict)
    fitted: str
    rows: tuple[str, ...]
    residuals: dict[str, float]
    loo_residuals: dict[str, float] = Field(default_factory=dict)
    rms: float
    simulated_residuals: dict[str, float] = Field(default_factory=dict)


STACK_RULES = ("tp_comm_overlap", "recompute_policy", "compile", "cp_comm_type", "host_op_s")
"""A stack's rules for scenario keys it decides where the scenario sets none; each names its
source (``<rule>_source``)."""


class Stack(Strict):
    """A software stack a scenario names (``software.stack``).

    A stack either has a fit of its own per chip family (neither ``base`` nor
    ``prior``), is a release of another that runs the same kernels and is fitted
    with it (``base``), or has no published run to fit and runs on another
    stack's fitted efficiencies (``prior``), with ``prior_spread`` joining its
    interval. ``why`` says why a base or prior stands for it."""

    what: str = Field(min_length=1)
    families: tuple[str, ...] = ()
    """The chip families it runs on; a release (``base``) runs where its base does."""
    base: str | None = None
    prior: str | None = None
    why: str = ""
    prior_spread: float | None = Field(default=None, gt=0, lt=1)
    """With ``prior``: the relative half-width (a 90% band) of running on another
    stack's fit, joined with the family's interval in quadrature."""
    source: str = ""
    tp_comm_overlap: Literal["blocking", "backward", "dataflow", "userbuffers"] | None = None
    """What the backward of a tensor-parallel sublayer overlaps its TP collectives with
    (``parallelism.tp_comm_overlap``, clustersim.workload.tp_comm), as the stack's code
    schedules it; a release (``base``) takes its base's. Absent: blocking."""
    tp_comm_overlap_source: str = ""
    """Where the stack's code or documentation shows its ``tp_comm_overlap``."""
    recompute_policy: Literal["modules", "op"] | None = None
    """``parallelism.recompute_policy`` under the stack (a release: its base's; absent: modules)."""
    recompute_policy_source: str = ""
    compile: bool | None = None
    """``software.compile`` under the stack (a release: its base's; absent: no switch)."""
    compile_source: str = ""
    cp_comm_type: Literal["all_gather", "p2p"] | None = None
    """``parallelism.cp_comm_type`` under the stack: how its attention runs with cp > 1 (a
    release: its base's; absent: all_gather)."""
    cp_comm_type_source: str = ""
    host_op_s: float | None = Field(default=None, ge=0, le=1)
    """``software.host_op_s`` under the stack (absent: 0), fitted on its own rows
    (``clustersim.calibration.host``)."""
    host_op_s_source: str = ""

    @model_validator(mode="after")
    def _one_kind(self) -> Stack:
        for rule in STACK_RULES:  # each names its source
            if getattr(self, rule) is not None and not getattr(self, f"{rule}_source"):
                raise ValueError(f"a stack's {rule} names its source ({rule}_source)")
        if self.base is not None and self.prior is not None:
            raise ValueError("a stack has a base or a prior, not both")
        if (self.base or self.prior) and not self.why:
            raise ValueError("a stack with a base or a prior says why (`why`)")
        if self.prior is not None and self.prior_spread is None:
            raise ValueError("a stack with a prior declares its prior_spread")
        if self.base is None and not self.families:
            raise ValueError("a stack without a base names the chip families it runs on")
        return self


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
            if stack in self.stacks and self.stacks[stack].base is not None:
                raise ValueError(f"fit {key!r}: stack {stack!r} is fitted as its base")
            if stack in self.stacks and self.stacks[stack].prior is not None:
                raise ValueError(f"fit {key!r}: stack {stack!r} runs on its prior's fit")
        for name, fam in self.families.items():
            if fam.prior is None:
                continue
            prior = self.families.get(fam.prior)
            if prior is None or fam.prior == name:
                raise ValueError(f"family {name!r}: prior {fam.prior!r} must be another family")
            if prior.prior is not None:
                raise ValueError(
                    f"family {name!r}: prior {fam.prior!r} has a prior of its own; name that one"
                )
        for start, entry in self.stacks.items():  # every chain of bases ends at a stack
            name, seen = start, {start}
            while (base := self.stacks[name].base) is not None:
                if base not in self.stacks:
                    raise ValueError(f"stack {name!r}: base {base!r} is not a declared stack")
                if base in seen:
                    raise ValueError(f"stacks: the bases of {sorted(seen)} form a cycle")
                name = base
                seen.add(name)
            lender = entry.prior
            if lender is not None and (
                lender not in self.stacks or self.stacks[lender].prior is not None
            ):
                raise ValueError(f"stack {start!r}: prior {lender!r} must be a stack with a fit")
            unknown = set(entry.families) - set(self.families)
            if unknown:
                raise ValueError(f"stack {start!r}: unknown chip families {sorted(unknown)}")
        for name, fam in self.families.items():
            if fam.default_stack not in self.stacks:
                raise ValueError(f"family {name!r}: default_stack {fam.default_stack!r} unknown")
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
    while stack in cal.stacks and (base := cal.stacks[stack].base) is not None:
        stack = base
    return stack


def fit_source(chip: str, stack: str, cal: CalibrationFile | None = None) -> str | None:
    """The fit (``family/stack``) whose constants ``chip`` runs ``stack`` with, or None:
    its family's fit of the stack it is fitted as (:func:`fit_stack`); for a stack with a
    prior and no fit of its own, its prior stack's (or, where the prior has none on the
    family, the family's default stack's); else the family's pooled fit (``family/all``),
    else its prior family's fit of that stack (module doc)."""
    cal = cal or calibration()
    family = family_of(chip, cal)
    if family is None:
        return None
    stack = fit_stack(stack, cal)
    prior = cal.stacks[stack].prior if stack in cal.stacks else None
    if prior is not None and f"{family}/{stack}" not in cal.fits:
        # a stack with no fit of its own runs on its prior's, not on the family's pool;
        # where its prior has none on this family, on the family's default stack's
        key = _family_fit(family, fit_stack(prior, cal), cal)
        default = fit_stack(cal.families[family].default_stack, cal)
        return key if key is not None else _family_fit(family, default, cal)
    return _family_fit(family, stack, cal)


def _family_fit(family: str, stack: str, cal: CalibrationFile) -> str | None:
    """``family``'s fit of ``stack``, its pooled fit, or its prior family's fit of ``stack``."""
    for key in (f"{family}/{stack}", f"{family}/all"):
        if key in cal.fits:
            return key
    prior = cal.families[family].prior
    for key in (f"{prior}/{stack}", f"{prior}/all") if prior is not None else ():
        if key in cal.fits:
            return key
    return None


def fit_overrides(chip: str, stack: str, cal: CalibrationFile | None = None) -> dict[str, float]:
    """The fitted constants ``chip`` runs ``stack`` with (:func:`fit_source`); from a
    prior's fit (another family's, or another stack's) only the efficiencies ``chip``'s
    family declares."""
    cal = cal or calibration()
    key = fit_source(chip, stack, cal)
    if key is None:
        return {}
    constants = dict(cal.fits[key].constants)
    family = family_of(chip, cal)
    lent_stack = key.partition("/")[2] not in (fit_stack(stack, cal), "all")
    if family is not None and (key.partition("/")[0] != family or lent_stack):  # lent
        declared = cal.families[family].constants
        constants = {
            k: v for k, v in constants.items() if k.endswith(PRIOR_SUFFIX) and k in declared
        }
    return constants


def residual_basis(family: str, cal: CalibrationFile | None = None) -> list[float]:
    """The leave-one-out residuals of every fit of ``family``."""
    cal = cal or calibration()
    residuals: list[float] = []
    for key, fit in sorted(cal.fits.items()):
        if key.partition("/")[0] == family:
            residuals += list(fit.loo_residuals.values())
    return residuals


def pooled_spread(cal: CalibrationFile | None = None) -> float | None:
    """The model's half-width (log) from the left-out residuals of every family together:
    the floor of each family's (module doc); None under two residuals."""
    cal = cal or calibration()
    return spread([e for fit in cal.fits.values() for e in fit.loo_residuals.values()])


def model_spread(family: str, cal: CalibrationFile | None = None) -> tuple[float, str]:
    """(half-width in log, what it is) of ``family``'s model error: its own left-out
    residuals' spread, or its declared default without two, never under the pooled one."""
    cal = cal or calibration()
    loo = residual_basis(family, cal)
    own = spread(loo)
    if own is None:
        d = cal.families[family].default_spread
        own, basis = math.log1p(d), f"no left-out residuals, declared default ±{d:.0%}"
    else:
        basis = f"90% from {len(loo)} rows left out in turn, {len(loo) - 1} dof"
    pooled = pooled_spread(cal)
    if pooled is not None and pooled > own:
        n = sum(len(fit.loo_residuals) for fit in cal.fits.values())
        basis += f", floored at every family's {n} rows' ±{math.expm1(pooled):.1%}"
        own = pooled
    return own, basis


def _t95(dof: int) -> float:
    """The 95th percentile of Student's t with ``dof`` degrees of freedom (what
    ``scipy.stats.t.ppf`` computes, without the seconds ``scipy.stats`` takes to import)."""
    from scipy.special import stdtrit

    return float(stdtrit(dof, 0.95))


def spread(loo: list[float]) -> float | None:
    """The model's half-width, in log space, of the 90% prediction interval from
    leave-one-out residuals: ``t(0.95, n - 1) sqrt(sum e^2 / n)``; None under two."""
    n = len(loo)
    if n < 2:
        return None
    return _t95(n - 1) * math.sqrt(sum(e * e for e in loo) / n)


def half_width(model: float, noise: float, prior: float = 0.0) -> float:
    """The model's half-width (log), the reference noise (relative) and the spread of
    running on a prior stack's fit (relative) in quadrature."""
    return math.hypot(model, math.log1p(noise), math.log1p(prior))


def interval(
    chip: str, step_s: float, cal: CalibrationFile | None = None, stack: str | None = None
) -> tuple[float, float, str]:
    """(low, high, basis) of a predicted step time on ``chip`` running ``stack`` (the
    family's default when None); see the module doc. A stack that runs on a prior
    stack's fit widens the interval by its ``prior_spread``."""
    cal = cal or calibration()
    family = family_of(chip, cal)
    if family is None:
        half = 0.25
        return step_s / (1 + half), step_s * (1 + half), f"{chip}: no calibration family, ±25%"
    noise = cal.families[family].reference_noise.spread
    model, what = model_spread(family, cal)
    fitted = fit_stack(stack or cal.families[family].default_stack, cal)
    entry = cal.stacks.get(fitted)
    prior = entry.prior_spread if entry is not None and entry.prior is not None else None
    half = half_width(model, noise, prior or 0.0)
    basis = f"{family}: {what}, {noise:.1%} reference noise"
    if prior and entry is not None:
        basis += f", ±{prior:.0%} for running on {entry.prior}'s fit"
    return step_s * math.exp(-half), step_s * math.exp(half), basis


def overlaps(a: tuple[float, float] | list[float], b: tuple[float, float] | list[float]) -> bool:
    """Whether two intervals (low, high) overlap: then the model cannot tell them apart."""
    return a[0] <= b[1] and b[0] <= a[1]


def ceiling_problems(cal: CalibrationFile | None = None) -> list[str]:
    """Every constant at or above its physical ceiling: a shipped fit's, or one a family
    runs with through its default stack (its own fit or one lent by a prior), which
    presses on it (a mechanism the model lacks, not a fact about the chip); or a chip's
    declared catalog value above it."""
    from clustersim import catalog

    cal = cal or calibration()
    out: list[str] = []

    def press(where: str, family: Family, name: str, value: float) -> None:
        ceiling = family.ceiling(name)
        if ceiling is not None and value >= ceiling.value * (1 - CEILING_MARGIN):
            out.append(
                f"{where}: {name} {value:.4g} presses on its ceiling {ceiling.value:.4g} "
                f"({ceiling.source}): find the mechanism the fit stands in for"
            )

    for key, fit in sorted(cal.fits.items()):
        family = cal.families[key.partition("/")[0]]
        for name, value in sorted(fit.constants.items()):
            press(key, family, name, value)
    for fname, family in sorted(cal.families.items()):
        for chip in family.chips:
            src = fit_source(chip, family.default_stack, cal)
            if src is not None and src.partition("/")[0] != fname:  # lent by a prior
                lent = fit_overrides(chip, family.default_stack, cal)
                for name, value in sorted(lent.items()):
                    press(f"{chip} ({fname}, lent by {src})", family, name, value)
            declared = catalog.chip(chip).calibration
            for name in sorted({*family.constants, *family.ceilings}):
                given = getattr(declared, name, None)
                ceiling = family.ceiling(name)
                if ceiling is not None and given is not None and given > ceiling.value:
                    out.append(
                        f"{chip} ({fname}): declared {name} {given:.4g} is above its ceiling "
                        f"{ceiling.value:.4g} ({ceiling.source})"
                    )
    return out
