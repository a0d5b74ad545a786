"""Failure-rate presets: YAML files in ``presets/``, each a set of failure classes
with the published observation its rates come from.

A preset class states what was seen (``failures`` on ``components`` components
over ``over``), so its rate per component carries over to a cluster of any size:
the class's rate in a scenario is that per-component rate times the scenario's
own count of such components.
"""

from __future__ import annotations

import functools
from importlib import resources

from pydantic import Field, ValidationError

from clustersim.catalog import pydantic_error, register_model
from clustersim.catalog.schema import Strict
from clustersim.catalog.shipped import load_yaml
from clustersim.errors import ScenarioError
from clustersim.scenario.failures import FailureClassCfg

__all__ = ["Preset", "preset", "preset_names"]


@register_model
class Preset(Strict):
    """A named set of failure classes, every figure with its source."""

    description: str
    sources: dict[str, str]
    classes: dict[str, FailureClassCfg] = Field(min_length=1)


def _files() -> dict[str, str]:
    root = resources.files("clustersim.failures") / "presets"
    return {
        f.name.removesuffix(".yaml"): f.read_text("utf-8")
        for f in root.iterdir()
        if f.name.endswith(".yaml")
    }


@functools.cache
def _all() -> dict[str, str]:
    return _files()


def preset_names() -> list[str]:
    """Names of the presets shipped with clustersim."""
    return sorted(_all())


@functools.cache
def preset(name: str) -> Preset:
    """The preset ``name``; a ``ScenarioError`` at ``failures.preset`` if unknown."""
    texts = _all()
    if name not in texts:
        raise ScenarioError(
            "failures.preset", name, f"unknown preset; valid: {', '.join(preset_names())}"
        )
    try:
        return Preset.model_validate(load_yaml(texts[name]))
    except ValidationError as exc:  # a broken shipped file: still say where
        raise pydantic_error(exc, f"presets/{name}.yaml") from None
