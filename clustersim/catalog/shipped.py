"""Parsing the YAML files shipped with clustersim (catalogs, references, presets).

libyaml's C parser reads them about ten times faster than PyYAML's pure-Python
one (the chips and instances catalogs: 0.2 s each in Python, 0.02 s in C), and
gives the same data for them. Files users write keep PyYAML's safe loader, for
its error messages.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["load_yaml"]

_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, with libyaml's parser where PyYAML was built with it."""
    return yaml.load(text, Loader=_LOADER)
