"""Names people type: collectives, algorithms, pipeline schedules, pricing modes.

``all-reduce`` is how nccl-tests and most people write what clustersim calls
``all_reduce``: wherever one of these names is typed (a scenario, ``--set``, a
study, a command-line option), a hyphen reads as an underscore and case does not
matter, and what is stored and printed is the canonical name. A name that is still
unknown gets the closest valid one as a suggestion.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from clustersim.errors import ScenarioError

__all__ = ["canonical", "canonical_value", "check", "closest"]


def canonical(name: str) -> str:
    """``All-Reduce`` -> ``all_reduce``: lower case, hyphens as underscores."""
    return name.strip().lower().replace("-", "_")


def canonical_value(value: Any) -> Any:
    """:func:`canonical` for a string, anything else unchanged (for validators, which
    leave the type errors to the schema)."""
    return canonical(value) if isinstance(value, str) else value


def closest(name: str, valid: Sequence[str]) -> str | None:
    """The valid name nearest to ``name`` (compared in canonical form), or None."""
    by_canonical = {canonical(v): v for v in valid}
    match = difflib.get_close_matches(canonical(name)[:200], list(by_canonical), n=1, cutoff=0.5)
    return by_canonical[match[0]] if match else None


def check(path: str, name: str, valid: Sequence[str], problem: str) -> str:
    """The canonical spelling of ``name`` if it is one of ``valid``; otherwise a
    :class:`ScenarioError` at ``path``: ``problem``, the closest valid name, the others."""
    spelled = canonical(name)
    if spelled in valid:
        return spelled
    near = closest(name, valid)
    hint = f"did you mean {near!r}? " if near else ""
    raise ScenarioError(path, name, f"{problem}; {hint}valid: {', '.join(valid)}")
