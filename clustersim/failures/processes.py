"""Failure classes of a cluster, and their failure times.

A :class:`FailureClass` is a scenario's (or preset's) class resolved against a
cluster: its per-component MTBF, its Weibull shape and the number of such
components in the cluster. Each component is a renewal process: it fails after
a Weibull (or exponential) lifetime, is replaced by a new one at once (the job
gets a spare or a replacement; the failed part goes to repair), and starts a new
lifetime. Every component starts new at time zero.

Times are drawn up front, vectorised with numpy: for an exponential class the
superposition of its components is a Poisson process of rate components / MTBF,
and for a Weibull class one lifetime is drawn per component and generation until
every component has passed the horizon. The simulation then has one event per
failure, never one per component.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from clustersim.errors import MISSING, ScenarioError
from clustersim.scenario.failures import COMPONENT_KINDS, FailureClassCfg, FailuresCfg

__all__ = [
    "MAX_FAILURES",
    "FailureClass",
    "expected_failures",
    "merge_classes",
    "resolve_classes",
    "sample_failures",
]

MAX_FAILURES = 1_000_000
"""Most failures one simulated horizon may expect: beyond it the scenario's rates
(or its horizon) are refused rather than drawn."""

_FIELDS = tuple(FailureClassCfg.model_fields)


@dataclass(frozen=True)
class FailureClass:
    """One failure class on one cluster."""

    name: str
    cause: str
    per: str
    components: int
    mtbf_s: float
    """Mean time between failures of one component."""
    shape: float
    repair_s: float
    effect: str

    @property
    def rate_per_s(self) -> float:
        """Long-run failures per second of the whole class (renewal theorem)."""
        return self.components / self.mtbf_s

    @property
    def scale_s(self) -> float:
        """Weibull scale parameter: the mean lifetime is scale x Gamma(1 + 1/shape)."""
        return self.mtbf_s / math.gamma(1.0 + 1.0 / self.shape)


def merge_classes(
    preset: Mapping[str, FailureClassCfg], rates: Mapping[str, FailureClassCfg]
) -> dict[str, tuple[str, FailureClassCfg]]:
    """The preset's classes with the scenario's ``rates`` over them, field by field.

    Each class comes with the key path its fields were last set under, for errors.
    """
    out: dict[str, tuple[str, FailureClassCfg]] = {
        name: (f"failures.preset.{name}", cfg) for name, cfg in preset.items()
    }
    for name, cfg in rates.items():
        base = out[name][1] if name in out else None
        if base is None:
            out[name] = (f"failures.rates.{name}", cfg)
            continue
        given = cfg.model_dump(exclude_unset=True)
        # An override's MTBF replaces the preset's observation (and vice versa).
        keep = base.model_dump(exclude_unset=True)
        if "mtbf" in given:
            for key in ("failures", "components", "over"):
                keep.pop(key, None)
        if {"failures", "components", "over"} & set(given):
            keep.pop("mtbf", None)
        out[name] = (f"failures.rates.{name}", FailureClassCfg.model_validate({**keep, **given}))
    return out


def _mtbf(path: str, cfg: FailureClassCfg) -> float:
    observed = (cfg.failures, cfg.components, cfg.over)
    if cfg.mtbf is not None:
        if any(v is not None for v in observed):
            raise ScenarioError(
                f"{path}.mtbf", cfg.mtbf, "give mtbf, or failures, components and over, not both"
            )
        return cfg.mtbf
    if cfg.failures is None or cfg.components is None or cfg.over is None:
        keys = ("failures", "components", "over")
        missing = [k for k, v in zip(keys, observed, strict=True) if v is None]
        if len(missing) == 3:
            raise ScenarioError(
                f"{path}.mtbf", MISSING, "give mtbf, or failures seen on components over a time"
            )
        raise ScenarioError(
            f"{path}.{missing[0]}", MISSING, "required with failures/components/over"
        )
    return cfg.components * cfg.over / cfg.failures


def resolve_classes(cfg: FailuresCfg, counts: Mapping[str, int]) -> list[FailureClass]:
    """The scenario's failure classes on a cluster with ``counts`` components of each kind.

    Raises ``ScenarioError`` naming the key path of a missing or bad field.
    """
    from clustersim.failures.presets import preset

    base = preset(cfg.preset).classes if cfg.preset is not None else {}
    classes: list[FailureClass] = []
    for name, (path, c) in sorted(merge_classes(base, cfg.rates).items()):
        if c.per is None:
            raise ScenarioError(
                f"{path}.per", MISSING, f"say what the rate counts: {', '.join(COMPONENT_KINDS)}"
            )
        if c.effect is None:
            raise ScenarioError(
                f"{path}.effect", MISSING, "say what a failure does: node, job or link"
            )
        mtbf = _mtbf(path, c) / cfg.rate_scale
        n = int(counts[c.per])
        if n < 1:
            continue  # the cluster has none of these components (no switches, say)
        classes.append(
            FailureClass(
                name=name,
                cause=c.cause or name,
                per=c.per,
                components=n,
                mtbf_s=mtbf,
                shape=c.shape if c.shape is not None else 1.0,
                repair_s=c.repair if c.repair is not None else 0.0,
                effect=c.effect,
            )
        )
    if not classes:
        raise ScenarioError("failures.rates", MISSING, "no failure class applies to this cluster")
    return classes


def expected_failures(classes: list[FailureClass], horizon_s: float) -> float:
    """Failures expected over the horizon in the long run (renewal rate x time)."""
    return sum(c.rate_per_s for c in classes) * horizon_s


def sample_failures(
    cls: FailureClass, horizon_s: float, rng: np.random.Generator
) -> NDArray[np.float64]:
    """Sorted failure times of the class in ``[0, horizon_s)``."""
    if cls.shape == 1.0:
        n = int(rng.poisson(cls.rate_per_s * horizon_s))
        return np.sort(rng.uniform(0.0, horizon_s, size=n))
    out: list[NDArray[np.float64]] = []
    drawn = 0
    t = cls.scale_s * rng.weibull(cls.shape, size=cls.components)
    t = t[t < horizon_s]
    while t.size:
        out.append(t)
        drawn += t.size
        if drawn > MAX_FAILURES:  # infant mortality can fail far more often than the MTBF says
            raise ScenarioError(
                f"failures.rates.{cls.name}.shape",
                cls.shape,
                f"more than {MAX_FAILURES:,} failures over the horizon; check the rates",
            )
        t = t + cls.scale_s * rng.weibull(cls.shape, size=t.size)
        t = t[t < horizon_s]
    return np.sort(np.concatenate(out)) if out else np.empty(0)
