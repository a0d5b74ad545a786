"""Expanding a study's axes into points.

Each axis yields a list of assignments (dotted key -> value); the points are the
cartesian product of the axes, the first axis varying slowest. A point is the
study's ``set`` overrides followed by its axis assignments, each written as the
text ``--set`` takes (``parallelism.tp=8``), so a point is exactly
``clustersim run BASE --set ...``. Its id is a hash of the base scenario, those
overrides and the run settings: stable across runs and worker counts, so a
rerun finds the points already done.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from clustersim.errors import ScenarioError
from clustersim.scenario.load import parse_yaml
from clustersim.sweep.spec import AxisSpec, Distribution, SeedsAxis, Study

__all__ = ["ID_CHARS", "Point", "axis_assignments", "expand", "point_id", "yaml_value"]

ID_CHARS = 16
"""Hex digits of a point id (64 bits: collisions are out of reach for any study)."""


@dataclass(frozen=True)
class Point:
    """One scenario of a study."""

    index: int  # position in the study's expansion order
    id: str
    overrides: tuple[str, ...]  # as --set takes them: the study's set, then the axes
    values: dict[str, Any] = field(default_factory=dict)  # axis key -> value


_FLOAT_TAG = "tag:yaml.org,2002:float"
_RESOLVER = yaml.resolver.Resolver()


def _float_text(value: float) -> str | None:
    """PyYAML's text for a finite float (``SafeRepresenter.represent_float``: the repr in
    lower case, with ``.0`` before a bare exponent so that YAML 1.1 reads a float),
    without the emitter's cost; None if it would not read back as this float."""
    if not math.isfinite(value):
        return None
    text = repr(value).lower()
    if "." not in text and "e" in text:
        text = text.replace("e", ".0e", 1)
    # The tag YAML gives this plain text (PyYAML's resolver is untyped).
    resolved = _RESOLVER.resolve(yaml.ScalarNode, text, (True, False))  # type: ignore[no-untyped-call]
    return text if resolved == _FLOAT_TAG and float(text) == value else None


def yaml_value(value: Any, where: str) -> str:
    """``value`` as the YAML text of a ``--set`` override, checked to read back unchanged."""
    if type(value) is float:  # a random axis draws many: skip the emitter and the parser
        fast = _float_text(value)
        if fast is not None:
            return fast
    scalar = type(value) in (int, str, bool)
    if scalar and (type(value), value) in _SCALAR_TEXTS:  # integers and choices repeat
        return _SCALAR_TEXTS[type(value), value]
    text = _dump_checked(value, where)
    if scalar and len(_SCALAR_TEXTS) < _MAX_CACHED:
        _SCALAR_TEXTS[type(value), value] = text
    return text


_SCALAR_TEXTS: dict[tuple[type, Any], str] = {}
_MAX_CACHED = 100_000


def _dump_checked(value: Any, where: str) -> str:
    text = yaml.safe_dump(
        value, default_flow_style=True, width=2**31 - 1, sort_keys=False, allow_unicode=True
    ).strip()
    if text.endswith("\n..."):  # a plain scalar is closed with a document end marker
        text = text[: -len("\n...")].strip()
    if "\n" in text or parse_yaml(text, where) != value:
        raise ScenarioError(where, value, "cannot be written as a --set value")
    return text


def _draw(dist: Distribution, rng: np.random.Generator) -> Any:
    value: float
    if dist.uniform is not None:
        value = float(rng.uniform(*dist.uniform))
    elif dist.loguniform is not None:
        lo, hi = dist.loguniform
        value = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    elif dist.normal is not None:
        value = float(rng.normal(*dist.normal))
    elif dist.integers is not None:
        return int(rng.integers(dist.integers[0], dist.integers[1], endpoint=True))
    else:
        choices = dist.choice or []
        return choices[int(rng.integers(len(choices)))]
    return round(value, dist.round) if dist.round is not None else value


def axis_assignments(axis: AxisSpec) -> list[dict[str, Any]]:
    """The assignments (key -> value) along one axis, in order."""
    if axis.grid is not None:
        keys = list(axis.grid)
        return [
            dict(zip(keys, combo, strict=True)) for combo in itertools.product(*axis.grid.values())
        ]
    if axis.zip is not None:
        keys = list(axis.zip)
        return [
            dict(zip(keys, combo, strict=True)) for combo in zip(*axis.zip.values(), strict=True)
        ]
    if axis.random is not None:
        spec = axis.random
        rng = np.random.default_rng(spec.seed)
        # One draw per key per sample, in the order written: deterministic for a seed.
        return [{k: _draw(d, rng) for k, d in spec.keys.items()} for _ in range(spec.n)]
    seeds = axis.seeds if isinstance(axis.seeds, SeedsAxis) else SeedsAxis(n=axis.seeds or 1)
    return [{"seed": seeds.start + i} for i in range(seeds.n)]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def point_id(base: dict[str, Any], overrides: tuple[str, ...], fidelity: str) -> str:
    """A stable id: a hash of what determines the point's result."""
    return _point_hasher(base, fidelity)(overrides)


def _point_hasher(base: dict[str, Any], fidelity: str) -> Callable[[tuple[str, ...]], str]:
    """``point_id`` for one base and fidelity: the canonical JSON of
    ``{"base", "fidelity", "overrides"}`` (keys sorted) is hashed once up to the
    overrides, so a point hashes only its own."""
    head = hashlib.sha256(
        f'{{"base":{_canonical(base)},"fidelity":{_canonical(fidelity)},"overrides":'.encode(
            "ascii"
        )
    )

    def pid(overrides: tuple[str, ...]) -> str:
        h = head.copy()
        h.update(_canonical(list(overrides)).encode("ascii") + b"}")
        return h.hexdigest()[:ID_CHARS]

    return pid


def expand(study: Study) -> list[Point]:
    """Every point of the study, in order."""
    spec = study.spec
    fixed = tuple(f"{k}={yaml_value(v, f'set.{k}')}" for k, v in spec.set.items())
    per_axis: list[list[tuple[dict[str, Any], tuple[str, ...]]]] = []
    for i, axis in enumerate(spec.axes):
        entries = []
        for assignment in axis_assignments(axis):
            texts = tuple(
                f"{k}={yaml_value(v, f'axes.{i}.{axis.kind}.{k}')}" for k, v in assignment.items()
            )
            entries.append((assignment, texts))
        per_axis.append(entries)
    points: list[Point] = []
    seen: dict[str, int] = {}
    hasher = _point_hasher(study.base, spec.run.fidelity)
    for index, combo in enumerate(itertools.product(*per_axis)):
        values: dict[str, Any] = {}
        overrides = list(fixed)
        for assignment, texts in combo:
            values.update(assignment)
            overrides.extend(texts)
        ov = tuple(overrides)
        pid = hasher(ov)
        if pid in seen:  # e.g. a zip or a random axis that repeats a value
            pid = f"{pid}-{index}"
        seen[pid] = index
        points.append(Point(index, pid, ov, values))
    return points
