"""Fits to a user's own cluster: collective tables and measured step times -> an overlay.

- **Collectives** (nccl-tests, nccom-test): the time of each measured collective
  is predicted by the estimate's alpha-beta model of the instance's fabric
  levels (``search.estimate.collective_s``: rings by level, halving-doubling by
  the runtime's size rule) for ``ranks`` ranks placed in order on ``count``
  instances. Two constants are fitted on log time: the chip's
  ``link_efficiency`` (the bandwidth term) and the latency of the outermost
  level the group crosses (``efa.latency_s`` across instances, else the scale-up
  ``fabric.link_latency_s``).
- **Step times** (a CSV of scenarios and measured seconds): the declared
  constants of the scenarios' chip family, fitted as for the reference rows.

The result is an overlay (``scenario.overlay``) a scenario loads with
``catalog_overlay:``, with the fit's inputs and residuals under ``fit``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from clustersim import catalog
from clustersim.calibration.fit import FitRow, fit_group
from clustersim.calibration.measurements import CollectivePoint
from clustersim.catalog.fits import calibration, family_of
from clustersim.errors import ScenarioError
from clustersim.scenario import load_scenario
from clustersim.search.estimate import NetModel, collective_s

__all__ = ["CollectiveFit", "fit_collectives", "fit_step_times", "overlay_of"]

LINK_EFFICIENCY_BOUNDS = (0.05, 1.0)
LATENCY_BOUNDS_S = (1e-7, 1e-3)


@dataclass
class CollectiveFit:
    instance: str
    chip: str
    link_efficiency: float
    latency_key: str  # "efa.latency_s" or "fabric.link_latency_s"
    latency_s: float
    previous: dict[str, float]
    residuals: list[float]
    points: int

    @property
    def rms(self) -> float:
        return math.sqrt(sum(r * r for r in self.residuals) / len(self.residuals))


def _predict(
    point: CollectivePoint, instance: str, count: int, eff: float, lat: float, *, key: str
) -> float:
    section, _, field = key.partition(".")
    over: dict[str, Any] = {section: {field: lat}}
    inst = catalog.instance(instance, over)
    chip = catalog.chip(inst.chip, {"calibration": {"link_efficiency": eff}})
    net = NetModel.of(inst, chip, count, chip.lnc_default)
    ranks = point.ranks or inst.chips * count * (chip.cores // chip.lnc_default)
    levels, sharing = net.levels(1, ranks)
    if not levels:
        raise ScenarioError(point.source, ranks, "a collective needs at least two ranks")
    return collective_s(point.op, point.size_bytes, levels, sharing)


def fit_collectives(points: list[CollectivePoint], instance: str, count: int) -> CollectiveFit:
    """Fit link efficiency and the outer level's latency to measured collectives."""
    from scipy.optimize import least_squares

    inst = catalog.instance(instance, None, "--instance")
    chip = catalog.chip(inst.chip)
    key = "efa.latency_s" if count > 1 else "fabric.link_latency_s"
    lat0 = inst.efa.latency_s if count > 1 else inst.fabric.link_latency_s
    eff0 = chip.calibration.link_efficiency

    def residuals(x: np.ndarray) -> np.ndarray:
        eff, log_lat = float(x[0]), float(x[1])
        return np.array(
            [
                math.log(_predict(p, instance, count, eff, math.exp(log_lat), key=key) / p.time_s)
                for p in points
            ]
        )

    lo = np.array([LINK_EFFICIENCY_BOUNDS[0], math.log(LATENCY_BOUNDS_S[0])])
    hi = np.array([LINK_EFFICIENCY_BOUNDS[1], math.log(LATENCY_BOUNDS_S[1])])
    x0 = np.clip(np.array([eff0, math.log(lat0)]), lo, hi)
    sol = least_squares(residuals, x0, bounds=(lo, hi), x_scale=hi - lo, method="trf")
    return CollectiveFit(
        instance=instance,
        chip=chip.name,
        link_efficiency=float(sol.x[0]),
        latency_key=key,
        latency_s=float(math.exp(sol.x[1])),
        previous={"link_efficiency": eff0, key: lat0},
        residuals=[float(r) for r in residuals(sol.x)],
        points=len(points),
    )


def fit_step_times(rows: list[tuple[Path, float]], source: str) -> tuple[str, dict[str, Any]]:
    """Fit the family constants to measured steps; returns (chip, fit record)."""
    cal = calibration()
    fit_rows: list[FitRow] = []
    family = None
    for path, seconds in rows:
        res = load_scenario(path)
        fam = family_of(res.chip.name, cal)
        if fam is None:
            raise ScenarioError(
                source, str(path), f"no calibration family for chip {res.chip.name}"
            )
        if family is not None and fam != family:
            raise ScenarioError(source, str(path), f"mixes chip families {family} and {fam}")
        family = fam
        fit_rows.append(FitRow(str(path), res, seconds))
    assert family is not None
    result = fit_group(f"{family}/user", fit_rows, cal.families[family])
    chip = fit_rows[0].res.chip.name
    record = {
        "constants": result.constants,
        "previous": result.previous,
        "rows": result.rows,
        "residuals": result.residuals,
        "rms": result.rms,
    }
    return chip, record


def overlay_of(
    collectives: CollectiveFit | None, steps: tuple[str, dict[str, Any]] | None, sources: list[str]
) -> dict[str, Any]:
    """The overlay mapping (``scenario.overlay``) of the fits, with their record under ``fit``."""
    chips: dict[str, Any] = {}
    instances: dict[str, Any] = {}
    fit: dict[str, Any] = {"fitted": datetime.now(UTC).date().isoformat(), "sources": sources}
    if steps is not None:
        chip, record = steps
        chips.setdefault(chip, {}).setdefault("calibration", {}).update(
            {k: round(v, 6) for k, v in record["constants"].items()}
        )
        fit["step_times"] = record
    if collectives is not None:
        c = collectives
        chips.setdefault(c.chip, {}).setdefault("calibration", {})["link_efficiency"] = round(
            c.link_efficiency, 6
        )
        section, _, field = c.latency_key.partition(".")
        instances[c.instance] = {section: {field: float(f"{c.latency_s:.6g}")}}
        fit["collectives"] = {
            "instance": c.instance,
            "points": c.points,
            "link_efficiency": c.link_efficiency,
            c.latency_key: c.latency_s,
            "previous": c.previous,
            "rms_log_error": c.rms,
        }
    out: dict[str, Any] = {}
    if chips:
        out["chips"] = chips
    if instances:
        out["instances"] = instances
    out["fit"] = fit
    return out
