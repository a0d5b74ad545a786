"""Study files: pydantic models (unknown keys are errors) and loading.

The format is described in :mod:`clustersim.sweep`. Loading reads the study with
the scenario loader's safe YAML parser, validates it, and reads the base
scenario (a path relative to the study file, or an inline mapping) as a raw
mapping: each point applies its overrides to a copy of it exactly as ``--set``
does, so a point is ``clustersim run BASE --set key=value ...``.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from clustersim import catalog
from clustersim.catalog import register_model
from clustersim.catalog.schema import Bytes, Strict
from clustersim.errors import MISSING, ScenarioError
from clustersim.scenario.load import check_values
from clustersim.scenario.yamlsafe import MAX_YAML_BYTES, parse_yaml

__all__ = [
    "AxisSpec",
    "Distribution",
    "RandomAxis",
    "ReportCfg",
    "RunCfg",
    "SeedsAxis",
    "Study",
    "StudySpec",
    "load_study",
    "parse_study",
]

MAX_POINTS = 1_000_000
"""Most points one study may expand to."""
MAX_AXIS_VALUES = 100_000
AXIS_KINDS = ("grid", "zip", "random", "seeds")

Values = list[Any]


def _check_key(key: str) -> str:
    parts = key.split(".")
    if not key or any(not p or p != p.strip() for p in parts):
        raise ValueError(f"expected a dotted scenario key such as parallelism.tp (got {key!r})")
    return key


@register_model
class Distribution(Strict):
    """How one key of a ``random`` axis is drawn: exactly one of the kinds below."""

    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None
    normal: tuple[float, float] | None = None  # mean, standard deviation
    integers: tuple[int, int] | None = None  # both ends included
    choice: list[Any] | None = Field(default=None, min_length=1, max_length=MAX_AXIS_VALUES)
    round: int | None = Field(default=None, ge=0, le=15)  # decimals kept of a float draw

    @model_validator(mode="after")
    def _one_kind(self) -> Distribution:
        kinds = [k for k in self.kinds() if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(
                "name exactly one of uniform, loguniform, normal, integers, choice "
                f"(got {', '.join(kinds) or 'none'})"
            )
        kind = kinds[0]
        pair = getattr(self, kind)
        if kind in ("uniform", "loguniform", "integers") and pair[0] > pair[1]:
            raise ValueError(f"{kind}: the low end {pair[0]} is above the high end {pair[1]}")
        if kind == "loguniform" and pair[0] <= 0:
            raise ValueError("loguniform: both ends must be positive")
        if kind == "normal" and pair[1] < 0:
            raise ValueError("normal: the standard deviation must not be negative")
        return self

    @staticmethod
    def kinds() -> tuple[str, ...]:
        return ("uniform", "loguniform", "normal", "integers", "choice")

    @property
    def kind(self) -> str:
        return next(k for k in self.kinds() if getattr(self, k) is not None)


@register_model
class RandomAxis(Strict):
    """``n`` points drawn from ``keys`` with a generator seeded by ``seed``."""

    n: int = Field(ge=1, le=MAX_AXIS_VALUES)
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    keys: dict[str, Distribution] = Field(min_length=1)

    @field_validator("keys")
    @classmethod
    def _dotted(cls, value: dict[str, Distribution]) -> dict[str, Distribution]:
        for key in value:
            _check_key(key)
        return value


@register_model
class SeedsAxis(Strict):
    """Monte Carlo repetitions: the scenario's ``seed`` takes ``start .. start + n - 1``."""

    n: int = Field(ge=1, le=MAX_AXIS_VALUES)
    start: int = Field(default=0, ge=0, le=2**62)


@register_model
class AxisSpec(Strict):
    """One axis of a study: exactly one of ``grid``, ``zip``, ``random``, ``seeds``."""

    grid: dict[str, Values] | None = Field(default=None, min_length=1)
    zip: dict[str, Values] | None = Field(default=None, min_length=1)
    random: RandomAxis | None = None
    seeds: int | SeedsAxis | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> AxisSpec:
        kinds = [k for k in AXIS_KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(
                f"an axis names exactly one of {', '.join(AXIS_KINDS)} "
                f"(got {', '.join(kinds) or 'none'})"
            )
        if isinstance(self.seeds, int) and not 1 <= self.seeds <= MAX_AXIS_VALUES:
            raise ValueError(f"seeds: expected 1 to {MAX_AXIS_VALUES:,} (got {self.seeds})")
        for table in (self.grid, self.zip):
            for key, values in (table or {}).items():
                _check_key(key)
                if not values or len(values) > MAX_AXIS_VALUES:
                    raise ValueError(f"{key}: expected 1 to {MAX_AXIS_VALUES:,} values")
        if self.zip is not None:
            lengths = {k: len(v) for k, v in self.zip.items()}
            if len(set(lengths.values())) > 1:
                shown = ", ".join(f"{k}: {n}" for k, n in lengths.items())
                raise ValueError(f"zip lists must have the same length ({shown})")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in AXIS_KINDS if getattr(self, k) is not None)

    def varied_keys(self) -> list[str]:
        """The scenario keys this axis sets."""
        if self.grid is not None:
            return list(self.grid)
        if self.zip is not None:
            return list(self.zip)
        if self.random is not None:
            return list(self.random.keys)
        return ["seed"]


@register_model
class RunCfg(Strict):
    """How every point is simulated (the flags of ``clustersim run``)."""

    fidelity: Literal["auto", "detailed", "folded"] = "auto"
    max_events: float = Field(default=60e6, gt=0, le=1e15, allow_inf_nan=False)
    max_memory: Bytes = Field(default=8 * 2**30, gt=0)


@register_model
class ReportCfg(Strict):
    """What ``clustersim report`` draws from the study's results (columns of
    ``results.parquet``; the Pareto front minimises both ``x`` and ``y``)."""

    x: str | None = None  # default: time_to_train_h with train_tokens, else step_time_s
    y: str = "cost.usd_per_million_tokens"
    train_tokens: float | None = Field(default=None, gt=0, le=1e18, allow_inf_nan=False)
    metrics: list[str] = Field(
        default_factory=lambda: ["step_time_s", "mfu", "cost.usd_per_million_tokens"],
        min_length=1,
        max_length=8,
    )


@register_model
class StudySpec(Strict):
    """A study file."""

    name: str = Field(min_length=1, max_length=200)
    description: str = ""
    base: str | dict[str, Any]
    set: dict[str, Any] = Field(default_factory=dict)
    axes: list[AxisSpec] = Field(default_factory=list, max_length=32)
    run: RunCfg = Field(default_factory=RunCfg)
    report: ReportCfg = Field(default_factory=ReportCfg)

    @field_validator("name")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("name must not be blank")
        return value

    @field_validator("set")
    @classmethod
    def _dotted(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            _check_key(key)
        return value


@dataclass(frozen=True)
class Study:
    """A validated study with its base scenario read as a raw mapping."""

    spec: StudySpec
    base: dict[str, Any]
    source: Path | None  # the study file, if it came from one
    base_label: str  # the base scenario's file name, or "inline"

    @property
    def name(self) -> str:
        return self.spec.name


def load_study(path: Path, *, allow_outside: bool = False) -> Study:
    """Read and validate a study file; every problem is a ``ScenarioError``."""
    return parse_study(_read(path, "study"), source=path, allow_outside=allow_outside)


def parse_study(text: str, source: Path | None = None, *, allow_outside: bool = False) -> Study:
    """Validate a study given as YAML text; ``source`` anchors a relative ``base`` path.

    A ``base`` file must lie under the study's directory or the working directory,
    so that a study file cannot read files elsewhere, unless ``allow_outside``.
    """
    label = _label(source.name) if source is not None else "<study>"
    data = parse_yaml(text, label)
    if data is None:
        raise ScenarioError(label, MISSING, "the study is empty")
    if not isinstance(data, dict):
        raise ScenarioError("", data, "a study must be a mapping of keys to values")
    check_values(data)
    for key, value in data.items():
        if key not in _TOP_KEYS:
            close = difflib.get_close_matches(str(key), _TOP_KEYS, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(_TOP_KEYS)}"
            raise ScenarioError(_label(str(key)), value, f"unknown key; {hint}")
    try:
        spec = StudySpec.model_validate(data)
    except ValidationError as exc:
        raise catalog.pydantic_error(exc, "") from None
    _check_axes(spec)
    if isinstance(spec.base, str):
        folder = source.parent if source is not None else Path.cwd()
        base_path = folder / spec.base
        if not allow_outside:
            _check_inside(base_path, (folder, Path.cwd()))
        base = parse_yaml(_read(base_path, "base"), "base")
        base_label = base_path.name
    else:
        base, base_label = dict(spec.base), "inline"
    if not isinstance(base, dict):
        raise ScenarioError("base", base, "the base scenario must be a mapping of keys to values")
    return Study(spec, base, source, base_label)


_TOP_KEYS = tuple(StudySpec.model_fields)


def _check_inside(path: Path, roots: tuple[Path, ...]) -> None:
    real = path.resolve()
    if not any(real.is_relative_to(root.resolve()) for root in roots):
        raise ScenarioError(
            "base",
            str(path),
            "lies outside the study's directory and the working directory; "
            "pass --allow-outside to read it",
        )


def _check_axes(spec: StudySpec) -> None:
    """No key varied twice (the later axis would silently win), and a bounded product."""
    seen: dict[str, int] = {}
    points = 1
    for i, axis in enumerate(spec.axes):
        for key in axis.varied_keys():
            if key in seen:
                raise ScenarioError(
                    f"axes.{i}.{axis.kind}", key, f"key already varied by axes.{seen[key]}"
                )
            if key in spec.set:
                raise ScenarioError(f"axes.{i}.{axis.kind}", key, "key also fixed in set")
            seen[key] = i
        points *= axis_size(axis)
        if points > MAX_POINTS:
            raise ScenarioError(
                "axes", MISSING, f"the study expands to more than {MAX_POINTS:,} points"
            )


def axis_size(axis: AxisSpec) -> int:
    if axis.grid is not None:
        return math.prod(len(v) for v in axis.grid.values())
    if axis.zip is not None:
        return len(next(iter(axis.zip.values())))
    if axis.random is not None:
        return axis.random.n
    if isinstance(axis.seeds, SeedsAxis):
        return axis.seeds.n
    return axis.seeds or 1


def _label(name: str) -> str:
    return name if name.isprintable() and name.strip() == name and name else repr(name)


def _read(path: Path, what: str) -> str:
    """The file's text; at most ``MAX_YAML_BYTES`` are read."""
    key = "" if what == "study" else what
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    except FileNotFoundError:
        raise ScenarioError(key, str(path), f"{what} file not found") from None
    except OSError as exc:
        raise ScenarioError(key, str(path), f"cannot read {what} file: {exc.strerror}") from None
    if len(raw) > MAX_YAML_BYTES:
        raise ScenarioError(key or _label(path.name), MISSING, "larger than 4 MiB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        problem = f"not UTF-8 text (invalid byte at {exc.start})"
        raise ScenarioError(key or _label(path.name), MISSING, problem) from None
