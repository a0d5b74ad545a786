"""``clustersim calibrate``: fit the declared constants, check the shipped fits, fit a cluster.

    clustersim calibrate                      # fit the reference rows, print what would move
    clustersim calibrate --write              # ... and write the fits into calibration.yaml
    clustersim calibrate --check              # exit 1 when the shipped fits differ from a fresh one
    clustersim calibrate --check --validation validate.json   # anchor on a validate run
    clustersim calibrate --instance p5.48xlarge --count 2 \\
        --nccl-tests all_reduce_perf.txt --step-times steps.csv --out my-cluster.yaml

Reference fits anchor the estimate on a simulation of each calibration row at
the shipped constants (``--no-simulate`` fits on the bare estimate):
the residual is ``log(sim(c0) / published) + log(est(c) / est(c0))``, so the
estimate supplies only the sensitivity to the constants and the simulator the
level. Each group is also refitted once without each of its rows in turn
(``leave_one_out``), the row left out predicted the same anchored way; those
out-of-sample residuals are stored beside the in-sample ones and make the
prediction intervals. ``--check`` refits from the shipped constants; when they are a fixed
point of the fit (within ``CHECK_TOLERANCE``) and the stored leave-one-out
residuals match fresh ones (within ``LOO_TOLERANCE``) it passes. ``--validation FILE``
takes ``sim(c0)`` from a ``clustersim validate --json-out FILE`` run (whose rows
ran at the shipped constants, which is checked), so the check costs only the
estimate's fits (seconds) where validate has run anyway, as in CI.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from clustersim.calibration.fit import (
    FitResult,
    FitRow,
    estimate_s,
    fit_group,
    group_rows,
    leave_one_out,
    prior_rows,
)
from clustersim.calibration.measurements import (
    CollectivePoint,
    op_from_name,
    parse_nccl_tests,
    parse_nccom_test,
    parse_step_times,
)
from clustersim.calibration.user import fit_collectives, fit_step_times, overlay_of
from clustersim.catalog.fits import (
    CalibrationFile,
    calibration,
    ceiling_problems,
    fit_overrides,
)
from clustersim.errors import ScenarioError

__all__ = [
    "CHECK_TOLERANCE",
    "LOO_TOLERANCE",
    "anchored",
    "calibrate_command",
    "fit_shipped",
    "load_validation",
]

CHECK_TOLERANCE = 0.005
"""Largest relative change of a fitted constant that ``--check`` accepts."""

LOO_TOLERANCE = 0.01
"""Largest change of a leave-one-out residual (log error, about a relative change of
the row's predicted step) that ``--check`` accepts: a hundredth moves a family's
interval by well under a tenth of its width, and is the validation table's noise."""


Simulated = dict[str, tuple[float, dict[str, float]]]
"""Per row: a simulated step time and the calibration constants it ran with."""


def anchored(
    rows: list[FitRow],
    cal: CalibrationFile,
    stacks: dict[str, str],
    simulated: Simulated | None = None,
) -> list[FitRow]:
    """Rows whose measured time absorbs the simulator's offset from the estimate.

    ``fit_group`` minimises ``log(est(c) / m')``; with ``m' = m est(c0) / sim(c0)``
    that is the anchored residual of the module doc. ``sim(c0)`` comes from
    ``simulated`` (a validate run at the shipped constants) where given, else from
    a simulation here.
    """
    from clustersim.calibration.fit import with_constants
    from clustersim.sim import simulate

    out = []
    for row in rows:
        shipped = fit_overrides(row.res.chip.name, stacks[row.name], cal)
        chip = with_constants(row.res.chip, shipped)
        res = replace(row.res, chip=chip) if shipped else row.res
        if simulated is not None:
            sim_s = simulated[row.name][0]
        else:
            sim_s = float(simulate(res, record=False).summary["step_time_s"])
        est_s = estimate_s(res)
        out.append(FitRow(row.name, row.res, row.measured_s * est_s / sim_s))
    return out


def load_validation(path: Path) -> Simulated:
    """The training rows' simulated step times of a ``validate --json-out`` file."""
    try:
        data = json.loads(path.read_text("utf-8"))
        rows = data["rows"]
        out: Simulated = {}
        for r in rows:
            if r.get("kind") != "training":
                continue
            ran = r.get("extra", {}).get("calibration") or {}
            constants = {str(k): float(v) for k, v in ran.items()}
            out[str(r["name"])] = (float(r["predicted"]), constants)
        return out
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        reason = exc if isinstance(exc, OSError) else f"not a validate --json-out file ({exc!r})"
        raise ScenarioError("--validation", str(path), f"cannot read: {reason}") from None


def _check_simulated(
    simulated: Simulated, groups: dict[str, list[FitRow]], cal: CalibrationFile, source: str
) -> None:
    """Every calibration row is in ``simulated``, run at the shipped constants."""
    from clustersim.validation.training import reference_stacks

    stacks = reference_stacks()
    chips = {row.name: row.res.chip.name for rows in groups.values() for row in rows}
    chips.update({name: chip for name, (chip, _) in prior_rows(cal).items()})
    for name, chip in chips.items():
        if name not in simulated:
            raise ScenarioError(
                "--validation", source,
                f"has no row {name}: run the full `clustersim validate` (not --quick)",
            )  # fmt: skip
        shipped = fit_overrides(chip, stacks[name], cal)
        ran = simulated[name][1]
        if set(ran) != set(shipped) or any(
            abs(ran[k] - v) > 1e-9 * max(1.0, abs(v)) for k, v in shipped.items()
        ):
            raise ScenarioError(
                "--validation", source,
                f"row {name} ran with {ran}, not the shipped fit {shipped}: "
                "run `clustersim validate` again",
            )  # fmt: skip


def fit_shipped(
    *,
    simulate: bool = True,
    cal: CalibrationFile | None = None,
    progress: Any = None,
    simulated: Simulated | None = None,
    source: str = "",
    loo: bool = True,
) -> list[FitResult]:
    """Fit every group of calibration rows, starting from the shipped fits, and (``loo``)
    each group again without each of its rows in turn.

    ``simulated`` (from :func:`load_validation`) supplies the anchoring
    simulations; it must hold every calibration row, run at the shipped constants.
    """
    from clustersim.validation.training import reference_stacks

    cal = cal or calibration()
    stacks = reference_stacks()
    results = []
    groups = group_rows(cal)
    if simulate and simulated is not None:
        _check_simulated(simulated, groups, cal, source)
    for key, rows in groups.items():
        if progress is not None:
            progress(key)
        family = cal.families[key.partition("/")[0]]
        use = anchored(rows, cal, stacks, simulated) if simulate else rows
        start = dict(cal.fits[key].constants) if key in cal.fits else None
        result = fit_group(key, use, family, start=start)
        if loo:
            leave_one_out(result, use, family)
        if key in cal.fits:  # "previous" stays what the catalog had before the first fit
            result.previous = {**cal.fits[key].previous, **result.previous}
            result.previous = {k: result.previous[k] for k in result.constants}
        results.append(result)
    return results


def _differences(results: list[FitResult], cal: CalibrationFile) -> list[str]:
    problems = []
    fresh = {r.key: r for r in results}
    for key in sorted(set(fresh) | set(cal.fits)):
        if key not in cal.fits:
            if fresh[key].constants:
                problems.append(f"{key}: fitted but not shipped ({_moves(fresh[key])})")
            continue
        if key not in fresh:
            problems.append(f"{key}: shipped but no longer has calibration rows")
            continue
        shipped, new = cal.fits[key], fresh[key]
        if set(shipped.rows) != set(new.rows):
            problems.append(f"{key}: rows changed: {sorted(shipped.rows)} -> {sorted(new.rows)}")
        for name in sorted(set(shipped.constants) | set(new.constants)):
            a, b = shipped.constants.get(name), new.constants.get(name)
            if a is None or b is None or abs(b - a) > CHECK_TOLERANCE * abs(a):
                problems.append(f"{key}: {name} shipped {a} but a fresh fit gives {b}")
        if new.loo and set(shipped.loo_residuals) != set(new.loo):
            problems.append(
                f"{key}: leave-one-out residuals shipped for {sorted(shipped.loo_residuals)}, "
                f"a fresh fit has {sorted(new.loo)}"
            )
            continue
        for row in sorted(new.loo):
            a, b = shipped.loo_residuals[row], new.loo[row]
            if abs(b - a) > LOO_TOLERANCE:
                problems.append(
                    f"{key}: leave-one-out residual of {row} shipped {a:+.4f} "
                    f"but a fresh fit gives {b:+.4f}"
                )
    return problems


def _moves(r: FitResult) -> str:
    return ", ".join(
        f"{k} {r.previous.get(k, float('nan')):.4g} -> {v:.4g}" for k, v in r.constants.items()
    )


def _write(results: list[FitResult], cal: CalibrationFile) -> Path:
    """Write the fits into the package's calibration.yaml, keeping its comments above."""
    path = Path(str(resources.files("clustersim.catalog").joinpath("calibration.yaml")))
    text = path.read_text("utf-8")
    head, sep, _ = text.partition("\nfits:")
    if not sep:
        raise ScenarioError(str(path), "", "no 'fits:' section to write into")
    fits: dict[str, Any] = {}
    for r in results:
        if not r.constants:
            continue
        unchanged = r.key in cal.fits and not _differences([r], _only(cal, r.key))
        date = cal.fits[r.key].fitted if unchanged else None  # a refit that moves nothing
        fits[r.key] = r.as_fit(date).model_dump(mode="json")
    body = yaml.safe_dump({"fits": fits}, sort_keys=True, width=100)
    path.write_text(head + "\n" + body, "utf-8")
    return path


def _only(cal: CalibrationFile, key: str) -> CalibrationFile:
    return cal.model_copy(update={"fits": {key: cal.fits[key]}})


def _user_points(args: argparse.Namespace) -> list[CollectivePoint]:
    points: list[CollectivePoint] = []
    for flag, parse in (("nccl_tests", parse_nccl_tests), ("nccom_test", parse_nccom_test)):
        for item in getattr(args, flag) or ():
            op, sep, name = item.partition("=")
            if not sep or op_from_name(op) is None:
                op, name = "", item
            path = Path(name)
            try:
                text = path.read_text("utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ScenarioError(
                    f"--{flag.replace('_', '-')}", name, f"cannot read: {exc}"
                ) from None
            points += parse(text, str(path), op_from_name(op) if op else None)
    return points


def _user(args: argparse.Namespace) -> int:
    if args.out is None:
        raise ScenarioError(
            "--out", None, "measurements are fitted into an overlay: give --out FILE"
        )
    sources: list[str] = []
    points = _user_points(args)
    coll = None
    if points:
        if args.instance is None:
            raise ScenarioError(
                "--instance", None, "collective measurements need the instance they ran on"
            )
        coll = fit_collectives(points, args.instance, args.count)
        sources += sorted({p.source for p in points})
    steps = None
    if args.step_times is not None:
        path = Path(args.step_times)
        try:
            text = path.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ScenarioError("--step-times", str(path), f"cannot read: {exc}") from None
        steps = fit_step_times(parse_step_times(text, str(path)), str(path))
        sources.append(str(path))
    overlay = overlay_of(coll, steps, sources)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(yaml.safe_dump(overlay, sort_keys=False, width=100), "utf-8")
    tmp.replace(out)
    if args.json:
        print(json.dumps(overlay, indent=2, default=str))
    else:
        if coll is not None:
            print(
                f"collectives: {coll.points} points on {coll.instance}: link_efficiency "
                f"{coll.previous['link_efficiency']:.3f} -> {coll.link_efficiency:.3f}, "
                f"{coll.latency_key} {coll.previous[coll.latency_key] * 1e6:.2f} -> "
                f"{coll.latency_s * 1e6:.2f} us (rms error {math.expm1(coll.rms):.1%})"
            )
        if steps is not None:
            rec = steps[1]
            moved = ", ".join(
                f"{k} {rec['previous'][k]:.4g} -> {v:.4g}" for k, v in rec["constants"].items()
            )
            moved = moved or "nothing fitted (too few rows)"
            print(f"step times: {len(rec['rows'])} scenarios: {moved}")
        print(f"overlay written to {out}; load it with `catalog_overlay: {out.name}`")
    return 0


def calibrate_command(args: argparse.Namespace) -> int:
    """Handler of ``clustersim calibrate``; see the module doc."""
    if args.nccl_tests or args.nccom_test or args.step_times:
        return _user(args)
    if args.out is not None:
        raise ScenarioError(
            "--out",
            args.out,
            "--out takes user measurements (--nccl-tests, --nccom-test, --step-times)",
        )
    cal = calibration()

    def progress(key: str) -> None:
        if not args.json:
            print(f"  fitting {key} ...", flush=True)

    simulated = None
    if args.validation is not None:
        if args.no_simulate:
            raise ScenarioError(
                "--validation", str(args.validation), "anchors the fit: leave out --no-simulate"
            )
        simulated = load_validation(args.validation)
    results = fit_shipped(
        simulate=not args.no_simulate,
        cal=cal,
        progress=progress,
        simulated=simulated,
        source=str(args.validation),
    )
    problems = _differences(results, cal) + ceiling_problems(cal)
    if args.json:
        out = {
            "fits": {
                r.key: {**r.as_fit().model_dump(mode="json"), "before": r.before} for r in results
            },
            "differences": problems,
        }
        print(json.dumps(out, indent=2))
    else:
        for r in results:
            before = math.sqrt(sum(v * v for v in r.before.values()) / len(r.before))
            moves = _moves(r) or "nothing fitted"
            loo = math.sqrt(sum(v * v for v in r.loo.values()) / len(r.loo)) if r.loo else 0.0
            print(
                f"{r.key}: {len(r.rows)} rows; {moves}; rms log error {before:.3f} -> {r.rms:.3f}"
                f" ({loo:.3f} with each row left out in turn)"
            )
        for name, (chip, key) in sorted(prior_rows(cal).items()):
            lent = fit_overrides(chip, key.partition("/")[2], cal)
            print(
                f"{name} ({chip}): no fit of its own; runs with its prior's {key} "
                + ", ".join(f"{k} {v:.4g}" for k, v in lent.items())
            )
    if args.write:
        path = _write(results, cal)
        if not args.json:
            print(f"written to {path}")
        return 0
    if args.check:
        for p in problems:
            print(f"calibrate --check: {p}")
        if not args.json:
            print(
                "calibrate --check: "
                + (
                    "shipped fits match a fresh fit"
                    if not problems
                    else f"{len(problems)} differences"
                )
            )
        return 1 if problems else 0
    return 0
