"""The shipped catalogs: chips, instances and models, as YAML data with sources.

``chip("trn2")``, ``instance("trn2.48xlarge")`` and ``model("llama3-8b")``
return validated specs. ``overrides`` is a nested mapping merged over the
catalog entry before validation, which is how a scenario changes any field.
"""

from __future__ import annotations

import difflib
from functools import cache
from importlib import resources
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from clustersim.catalog.schema import ChipSpec, InstanceSpec, ModelSpec
from clustersim.errors import CatalogError, ScenarioError

__all__ = [
    "KINDS",
    "chip",
    "deep_merge",
    "entries",
    "instance",
    "model",
    "names",
    "pydantic_error",
    "register_model",
]

Kind = Literal["chips", "instances", "models"]
KINDS: tuple[Kind, ...] = ("chips", "instances", "models")
_SPEC: dict[str, type[BaseModel]] = {
    "chips": ChipSpec,
    "instances": InstanceSpec,
    "models": ModelSpec,
}
S = TypeVar("S", bound=BaseModel)


@cache
def entries(kind: Kind) -> dict[str, dict[str, Any]]:
    """The raw YAML mappings of one catalog, keyed by name."""
    text = resources.files("clustersim.catalog").joinpath(f"{kind}.yaml").read_text("utf-8")
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise CatalogError(kind, type(data).__name__, "catalog file must be a mapping")
    return {str(k): v for k, v in data.items()}


def names(kind: Kind) -> list[str]:
    return sorted(entries(kind))


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Return ``base`` with ``over`` merged in; nested mappings merge, other values replace."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def pydantic_error(exc: ValidationError, prefix: str) -> ScenarioError:
    """Turn the first pydantic error into a ``ScenarioError`` with a dotted key path."""
    err = exc.errors(include_url=False)[0]
    loc = [str(p) for p in err["loc"]]
    path = ".".join([prefix, *loc] if prefix else loc)
    problem = err["msg"]
    value = err.get("input")
    if err["type"] == "extra_forbidden":
        problem = "unknown key"
        valid = _valid_keys(exc.title, loc[:-1])
        close = difflib.get_close_matches(loc[-1], valid, n=1)
        if close:
            problem += f"; did you mean {close[0]!r}?"
        elif valid:
            problem += f"; valid keys: {', '.join(valid)}"
    if problem.startswith("Value error, "):
        problem = problem[len("Value error, ") :]
    return ScenarioError(path, value, problem)


_MODELS: dict[str, type[BaseModel]] = {}


def register_model(cls: type[S]) -> type[S]:
    """Make a model's field names available to 'did you mean' suggestions."""
    _MODELS[cls.__name__] = cls
    return cls


for _cls in (ChipSpec, InstanceSpec, ModelSpec):
    register_model(_cls)


def _valid_keys(title: str, loc: list[str]) -> list[str]:
    cls: Any = _MODELS.get(title)
    for part in loc:
        if cls is None:
            return []
        field = cls.model_fields.get(part)
        if field is None:
            return []
        cls = _model_of(field.annotation)
    if cls is None:
        return []
    return sorted(cls.model_fields)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _resolve(kind: Kind, name: str, overrides: dict[str, Any] | None, path: str) -> Any:
    table = entries(kind)
    if name not in table:
        close = difflib.get_close_matches(name, list(table), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise CatalogError(
            path, name, f"unknown {kind[:-1]}; {hint}valid: {', '.join(sorted(table))}"
        )
    data = deep_merge({"name": name, **table[name]}, overrides or {})
    try:
        return _SPEC[kind].model_validate(data)
    except ValidationError as exc:
        raise pydantic_error(exc, path if overrides else f"catalog.{kind}.{name}") from None


def chip(
    name: str, overrides: dict[str, Any] | None = None, path: str = "cluster.chip"
) -> ChipSpec:
    spec: ChipSpec = _resolve("chips", name, overrides, path)
    return spec


def instance(
    name: str, overrides: dict[str, Any] | None = None, path: str = "cluster.instance"
) -> InstanceSpec:
    spec: InstanceSpec = _resolve("instances", name, overrides, path)
    return spec


def model(name: str, overrides: dict[str, Any] | None = None, path: str = "model") -> ModelSpec:
    spec: ModelSpec = _resolve("models", name, overrides, path)
    return spec
