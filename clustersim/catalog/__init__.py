"""The shipped catalogs: chips, instances and models, as YAML data with sources.

``chip("trn2")``, ``instance("trn2.48xlarge")`` and ``model("llama3-8b")``
return validated specs. ``overrides`` is a nested mapping merged over the
catalog entry before validation, which is how a scenario changes any field.
"""

from __future__ import annotations

import difflib
import re
from functools import cache
from importlib import resources
from types import UnionType
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from clustersim.catalog.schema import ChipSpec, InstanceSpec, ModelSpec
from clustersim.catalog.shipped import load_yaml
from clustersim.errors import MISSING, CatalogError, ScenarioError
from clustersim.names import closest

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
    data = load_yaml(text) or {}
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
    """Turn pydantic's most useful error into a ``ScenarioError`` with a dotted key path.

    For a union (``model: str | mapping``) pydantic reports one error per member,
    with the member's type as an extra ``loc`` entry; the deepest one is reported
    (it got furthest into the input), the type entry is dropped from the path, and
    members that failed alike are named together ("a valid string or a valid
    dictionary").
    """
    errors = exc.errors(include_url=False)
    err, alternatives = _pick(exc.title, errors)
    loc = list(err["loc"])
    value = err.get("input", MISSING)
    problem = err["msg"]
    if err["type"] == "missing":
        value, problem = MISSING, "required key is missing"
    elif loc and loc[-1] == "[key]":  # a mapping key of the wrong type
        loc, problem = loc[:-1], "keys must be strings"
    elif alternatives:
        problem = " or ".join(
            [problem, *(a.removeprefix("Input should be ") for a in alternatives)]
        )
    if err["type"] == "literal_error" and isinstance(value, str):
        expected = re.findall(r"'([^']*)'", str(err.get("ctx", {}).get("expected", "")))
        near = closest(value, expected)
        if near is not None:
            problem += f"; did you mean {near!r}?"
    parts = [_part(p) for p in loc]
    path = ".".join([prefix, *parts] if prefix else parts)
    if err["type"] == "extra_forbidden":
        problem = "unknown key"
        valid = _valid_keys(exc.title, [str(p) for p in loc[:-1]])
        close = difflib.get_close_matches(parts[-1][:200], valid, n=1)
        if close:
            problem += f"; did you mean {close[0]!r}?"
        elif valid:
            problem += f"; valid keys: {', '.join(valid)}"
    for noise in ("Value error, ", "Assertion failed, "):
        problem = problem.removeprefix(noise)
    return ScenarioError(path, value, " ".join(problem.split()))


def _pick(title: str, errors: list[ErrorDetails]) -> tuple[ErrorDetails, list[str]]:
    """The error to report, with union tags removed from its ``loc``, and the messages
    of the other union members that failed at the same place."""
    stripped = [_strip_union_tags(title, e["loc"]) for e in errors]
    first_loc, first_at = stripped[0]
    if first_at is None:
        return {**errors[0], "loc": first_loc}, []
    group = [
        (err, loc)
        for err, (loc, at) in zip(errors, stripped, strict=True)
        if at == first_at and loc[:first_at] == first_loc[:first_at]
    ]
    best, best_loc = max(group, key=lambda pair: len(pair[1]))  # the first of the deepest
    others = [e["msg"] for e, loc in group if loc == best_loc and e["msg"] != best["msg"]]
    return {**best, "loc": best_loc}, list(dict.fromkeys(others))


def _strip_union_tags(title: str, loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], int | None]:
    """``loc`` without the entries that name a union member, and where the first was.

    Follows ``loc`` through the registered models: after a field whose type is a
    union (``str | dict[str, Any]``; ``X | None`` is not one for pydantic), the next
    entry is the member's type, not a key.
    """
    cls: Any = _MODELS.get(title)
    out: list[Any] = []
    first: int | None = None
    i = 0
    while i < len(loc):
        part = loc[i]
        out.append(part)
        i += 1
        field = cls.model_fields.get(part) if cls is not None and isinstance(part, str) else None
        if field is None:
            cls = None
            continue
        members = [a for a in get_args(field.annotation) if a is not type(None)]
        if _is_union(field.annotation) and len(members) > 1 and i < len(loc):
            first = len(out) if first is None else first
            tag = loc[i]
            i += 1
            cls = next((m for m in members if getattr(m, "__name__", None) == tag), None)
        else:
            cls = _model_of(field.annotation)
    return tuple(out), first


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, UnionType)


def _part(key: Any) -> str:
    """A key as printed in a dotted path: itself, or its repr if that could mislead
    (control or invisible characters, surrounding blanks, the empty string)."""
    text = key if isinstance(key, str) else str(key)
    if len(text) > 60:
        return repr(text[:57] + "...")
    plain = text.isprintable() and text == text.strip() and text != ""
    return text if plain else repr(text)


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
