"""Software stacks: which fit a scenario runs with (``software.stack``).

    sf = stack_fit("h100", None)          # the family's default stack, megatron-core
    sf.constants                          # {"attention_efficiency": 0.3676, ...}
    sf.fit                                # "h100/megatron-core"
    stack_fit("h100", "torchtitan").lent  # "stack prior megatron-core"

Every scenario runs with its stack's fit on its chip's family: the fit is the
lowest layer over the catalog entry, below a catalog overlay and the scenario's
own ``cluster.chip`` keys, so a validation row and a user's scenario with the same
content run with the same constants. The stacks and fits are
``calibration.yaml``'s (:mod:`clustersim.catalog.fits`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clustersim.catalog.fits import (
    STACK_RULES,
    CalibrationFile,
    calibration,
    family_of,
    fit_overrides,
    fit_source,
    fit_stack,
)
from clustersim.errors import ScenarioError
from clustersim.names import closest

__all__ = [
    "StackFit",
    "compile_rule",
    "cp_comm_type",
    "default_stack",
    "describe_stack",
    "host_op_s",
    "recompute_policy",
    "stack_fit",
    "stack_lines",
    "stack_names",
    "tp_comm_overlap",
]


@dataclass(frozen=True)
class StackFit:
    """The software stack a scenario runs and the fit it runs with.

    ``stack`` as named (or the family's default, ``default``); ``fitted_as`` the end of
    its chain of bases; ``fit`` the ``family/stack`` fit its constants come from (None:
    the catalog's values); ``lent`` how a fit not its own reaches it (``family prior
    h100``, ``stack prior megatron-core``), None when it is its own."""

    stack: str | None
    default: bool
    fitted_as: str | None
    fit: str | None
    lent: str | None
    constants: dict[str, float] = field(default_factory=dict)
    tp_comm_overlap: str = "blocking"
    """The stack's TP overlap rule (``parallelism.tp_comm_overlap`` when the scenario
    sets none)."""
    recompute_policy: str = "modules"
    """What the stack's ``recompute: selective`` keeps (``parallelism.recompute_policy``
    when the scenario sets none)."""
    compile: bool | None = None
    """Whether the stack compiles its model by default (``software.compile`` when the
    scenario sets none); None: it has no such switch and runs its fused kernels."""
    cp_comm_type: str = "all_gather"
    """How the stack runs attention with cp > 1 (``parallelism.cp_comm_type`` when the
    scenario sets none)."""
    host_op_s: float = 0.0
    """Seconds the stack's host takes to issue one op (``software.host_op_s`` when the
    scenario sets none); 0: the host never holds the device back."""
    scaled: str | None = None
    """How the efficiencies reached a chip the fit's rows did not run on (the family's
    ``transfer``), e.g. ``from trn1 by the engine model, x1.031``; None when they did not
    move."""

    def describe(self) -> str:
        """One line for a summary: the stack and where its constants come from."""
        if self.stack is None:
            return "no software stack for this chip: catalog constants"
        name = f"{self.stack}{' (default)' if self.default else ''}"
        if self.fitted_as and self.fitted_as != self.stack:
            name += f", fitted as {self.fitted_as}"
        if self.fit is None:
            return f"{name}: no fit, catalog constants"
        how = f", lent by its {self.lent}" if self.lent else ""
        scaled = f", efficiencies scaled {self.scaled}" if self.scaled else ""
        host = f", host {self.host_op_s * 1e6:.4g} us an op" if self.host_op_s else ""
        return f"{name}: fit {self.fit}{how}{scaled}{host}"

    def as_dict(self) -> dict[str, object]:
        return {
            "stack": self.stack,
            "default": self.default,
            "fitted_as": self.fitted_as,
            "fit": self.fit,
            "lent": self.lent,
            "constants": dict(self.constants),
            "tp_comm_overlap": self.tp_comm_overlap,
            "recompute_policy": self.recompute_policy,
            "compile": self.compile,
            "cp_comm_type": self.cp_comm_type,
            "host_op_s": self.host_op_s,
            "scaled": self.scaled,
            "note": self.describe(),
        }


def _rule(stack: str | None, name: str, cal: CalibrationFile | None) -> Any:
    """The stack entry's rule ``name``: its own, else the nearest base's that declares
    one, else None."""
    cal = cal or calibration()
    while stack is not None and stack in cal.stacks:
        entry = cal.stacks[stack]
        if getattr(entry, name) is not None:
            return getattr(entry, name)
        stack = entry.base
    return None


def tp_comm_overlap(stack: str | None, cal: CalibrationFile | None = None) -> str:
    """The TP overlap rule ``stack`` runs (``Stack.tp_comm_overlap``): its own, else the
    nearest base's that declares one, else ``blocking``."""
    rule = _rule(stack, "tp_comm_overlap", cal)
    return "blocking" if rule is None else str(rule)


def recompute_policy(stack: str | None, cal: CalibrationFile | None = None) -> str:
    """What ``recompute: selective`` keeps under ``stack`` (``Stack.recompute_policy``): its
    own, else the nearest base's that declares one, else ``modules``."""
    rule = _rule(stack, "recompute_policy", cal)
    return "modules" if rule is None else str(rule)


def compile_rule(stack: str | None, cal: CalibrationFile | None = None) -> bool | None:
    """Whether ``stack`` compiles its model by default (``Stack.compile``): its own rule,
    else the nearest base's that declares one, else None: the stack has no such switch and
    runs its fused kernels (``workload.titan``)."""
    rule = _rule(stack, "compile", cal)
    return None if rule is None else bool(rule)


def cp_comm_type(stack: str | None, cal: CalibrationFile | None = None) -> str:
    """How ``stack`` runs attention with cp > 1 (``Stack.cp_comm_type``): its own rule, else
    the nearest base's that declares one, else ``all_gather``."""
    rule = _rule(stack, "cp_comm_type", cal)
    return "all_gather" if rule is None else str(rule)


def host_op_s(stack: str | None, cal: CalibrationFile | None = None) -> float:
    """Seconds ``stack``'s host takes to issue one op (``Stack.host_op_s``): its own, else
    the nearest base's that declares one, else 0."""
    rule = _rule(stack, "host_op_s", cal)
    return 0.0 if rule is None else float(rule)


_RULE_OF = {
    "tp_comm_overlap": tp_comm_overlap,
    "recompute_policy": recompute_policy,
    "compile": compile_rule,
    "cp_comm_type": cp_comm_type,
    "host_op_s": host_op_s,
}


def _rules(stack: str | None, cal: CalibrationFile) -> dict[str, Any]:
    """Every rule of ``stack`` (``STACK_RULES``), as ``StackFit`` holds them."""
    return {rule: _RULE_OF[rule](stack, cal) for rule in STACK_RULES}


def stack_names(cal: CalibrationFile | None = None) -> list[str]:
    return sorted((cal or calibration()).stacks)


def default_stack(chip: str, cal: CalibrationFile | None = None) -> str | None:
    """The stack a scenario on ``chip`` runs when it names none (None: no family)."""
    cal = cal or calibration()
    family = family_of(chip, cal)
    return None if family is None else cal.families[family].default_stack


def _runs_on(stack: str, cal: CalibrationFile) -> tuple[str, ...]:
    return cal.stacks[fit_stack(stack, cal)].families


def stack_fit(
    chip: str, stack: str | None, cal: CalibrationFile | None = None, path: str = "software.stack"
) -> StackFit:
    """The fit ``chip`` runs ``stack`` with (the family's default stack when None).

    Raises ``ScenarioError`` at ``path`` for an unknown stack or one that does not run
    on the chip's family."""
    cal = cal or calibration()
    family = family_of(chip, cal)
    if stack is not None and stack not in cal.stacks:
        hint = closest(stack, sorted(cal.stacks))
        valid = ", ".join(sorted(cal.stacks))
        more = f"did you mean {hint!r}? " if hint else ""
        raise ScenarioError(path, stack, f"unknown software stack; {more}valid: {valid}")
    if stack is not None and family is not None and family not in _runs_on(stack, cal):
        runs = ", ".join(_runs_on(stack, cal))
        where = chip if family == chip else f"{chip} ({family})"
        raise ScenarioError(path, stack, f"runs on {runs} chips, not on {where}")
    default = stack is None
    name = default_stack(chip, cal) if stack is None else stack
    if family is None or name is None:
        return StackFit(stack, default, None, None, None, **_rules(name, cal))
    fitted = fit_stack(name, cal)
    key = fit_source(chip, name, cal)
    lent = None
    if key is not None:
        fam, _, of = key.partition("/")
        if fam != family:
            lent = f"family prior {fam}"
        elif of not in (fitted, "all"):
            lent = f"stack prior {of}"
    constants = fit_overrides(chip, name, cal)
    return StackFit(name, default, fitted, key, lent, constants, **_rules(name, cal))


def describe_stack(name: str, cal: CalibrationFile | None = None) -> dict[str, object]:
    """What ``clustersim catalog stacks NAME`` shows: the stack, how it is fitted, and per
    chip family the fit it runs with, its constants and the rows behind them."""
    cal = cal or calibration()
    if name not in cal.stacks:
        hint = closest(name, sorted(cal.stacks))
        more = f"did you mean {hint!r}? " if hint else ""
        raise ScenarioError(
            "catalog stacks", name, f"unknown stack; {more}valid: {', '.join(sorted(cal.stacks))}"
        )
    entry = cal.stacks[name]
    fitted = fit_stack(name, cal)
    if entry.base is not None:
        kind = f"a release of {entry.base}, fitted as {fitted}"
    elif entry.prior is not None:
        kind = f"no fit of its own: runs on {entry.prior}'s fit (±{entry.prior_spread:.0%} more)"
    else:
        kind = "fitted per chip family"
    fits: dict[str, object] = {}
    for family in _runs_on(name, cal):
        chip = cal.families[family].chips[0]
        sf = stack_fit(chip, name, cal)
        if sf.fit is None:
            fits[family] = "no fit: the catalog's constants"
            continue
        fit = cal.fits[sf.fit]
        fits[family] = {
            "fit": sf.fit,
            "lent": sf.lent,
            "constants": sf.constants,
            "rows": list(fit.rows),
            "rms_log_error": fit.rms,
            "fitted": fit.fitted,
        }
    releases = sorted(s for s, e in cal.stacks.items() if e.base == name)
    out: dict[str, object] = {
        "stack": name,
        "what": entry.what,
        "kind": kind,
        "runs_on": {f: list(cal.families[f].chips) for f in _runs_on(name, cal)},
        "default_for": sorted(f for f, fam in cal.families.items() if fam.default_stack == name),
    }
    if entry.why:
        out["why"] = entry.why
    for rule, value in _rules(name, cal).items():
        out[rule] = value
        if getattr(entry, f"{rule}_source"):
            out[f"{rule}_source"] = getattr(entry, f"{rule}_source")
    if releases:
        out["releases"] = releases
    if entry.source:
        out["source"] = entry.source
    out["fits"] = fits
    return out


def stack_lines(cal: CalibrationFile | None = None) -> list[str]:
    """One line per stack for ``clustersim catalog stacks``: its kind and, per chip family,
    the fit it runs with and how many rows are behind it."""
    cal = cal or calibration()
    lines = []
    for name in sorted(cal.stacks):
        d = describe_stack(name, cal)
        default = d["default_for"]
        tag = f" [default on {', '.join(default)}]" if isinstance(default, list) and default else ""
        parts = []
        fits = d["fits"]
        assert isinstance(fits, dict)
        for family, fit in fits.items():
            if isinstance(fit, dict):
                lent = f", {fit['lent']}" if fit["lent"] else ""
                parts.append(f"{family}: {fit['fit']} ({len(fit['rows'])} rows{lent})")
            else:
                parts.append(f"{family}: catalog constants")
        lines.append(f"{name}{tag}: {d['kind']}; " + "; ".join(parts))
    return lines
