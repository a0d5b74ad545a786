"""Catalog overlays: a user's calibrated constants, loaded by ``catalog_overlay:``.

An overlay is a YAML file that ``clustersim calibrate --out`` writes (or a user
writes by hand) with entries merged over the shipped catalog::

    chips:
      h100: {calibration: {link_efficiency: 0.74, tensor_efficiency: 0.78}}
    instances:
      p5.48xlarge: {efa: {latency_s: 21us}}
    fit: {...}          # what the fit was made from (ignored when loading)

Every entry is validated against its catalog entry when the overlay loads,
whichever chip the scenario uses, so an overlay is valid or not on its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from clustersim import catalog
from clustersim.errors import ScenarioError

__all__ = ["Overlay", "load_overlay"]

Overlay = dict[str, dict[str, dict[str, Any]]]
_KINDS = {"chips": catalog.chip, "instances": catalog.instance}
MAX_OVERLAY_BYTES = 1 << 20


def load_overlay(path: str) -> Overlay:
    """The overlay at ``path``, every entry checked; errors name ``catalog_overlay``."""
    key = "catalog_overlay"
    file = Path(path)
    try:
        with file.open("rb") as f:
            raw = f.read(MAX_OVERLAY_BYTES + 1)
    except OSError as exc:
        raise ScenarioError(key, path, f"cannot read the overlay: {exc.strerror}") from None
    if len(raw) > MAX_OVERLAY_BYTES:
        raise ScenarioError(key, path, "overlay larger than 1 MiB")
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        problem = str(exc).splitlines()[0]
        raise ScenarioError(key, path, f"not a YAML overlay: {problem}") from None
    if not isinstance(data, dict):
        raise ScenarioError(key, path, "an overlay is a mapping with chips and/or instances")
    out: Overlay = {}
    for kind, entries in data.items():
        if kind == "fit":
            continue
        if kind not in _KINDS:
            raise ScenarioError(
                f"{key}.{kind}", path, "unknown section; valid: chips, instances, fit"
            )
        if not isinstance(entries, dict):
            raise ScenarioError(f"{key}.{kind}", entries, "a mapping of catalog names to fields")
        out[kind] = {}
        for name, fields in entries.items():
            if not isinstance(fields, dict):
                raise ScenarioError(f"{key}.{kind}.{name}", fields, "a mapping of fields")
            _KINDS[kind](str(name), fields, f"{key}.{kind}.{name}")  # validates the merge
            out[kind][str(name)] = fields
    return out
