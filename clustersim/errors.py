"""The exception hierarchy. Every error a user can cause is a ``ClusterSimError``.

Messages name the key path and the offending value, so the CLI can print one
line and exit with code 2 (bad input) instead of a traceback.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CatalogError",
    "ClusterSimError",
    "PartitionError",
    "ScenarioError",
    "SimulationError",
]


class ClusterSimError(Exception):
    """Base class of all clustersim errors."""

    exit_code: int = 1


class ScenarioError(ClusterSimError):
    """Invalid user input: a scenario, an override, a catalog reference.

    ``path`` is the dotted key path (``parallelism.tp``); ``value`` the bad value.
    """

    exit_code = 2

    def __init__(self, path: str, value: Any, problem: str) -> None:
        self.path = path
        self.value = value
        self.problem = problem
        shown = _short_repr(value)
        where = path or "<scenario>"
        super().__init__(f"{where}: {problem} (got {shown})" if shown else f"{where}: {problem}")

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its three parts (it crosses process boundaries: validate --jobs)."""
        return (type(self), (self.path, self.value, self.problem))


class CatalogError(ScenarioError):
    """An unknown or malformed catalog entry."""


class PartitionError(ClusterSimError):
    """A communication group cannot reach all its members: the fabric is cut."""

    exit_code = 2


class SimulationError(ClusterSimError):
    """An internal inconsistency detected while simulating."""


def _short_repr(value: Any, limit: int = 80) -> str:
    if value is _MISSING:
        return ""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"

    def __reduce__(self) -> str:
        return "_MISSING"  # unpickled as the one sentinel, not a copy


_MISSING: Any = _Missing()
MISSING: Any = _MISSING
"""Sentinel for ``ScenarioError(value=MISSING)`` when a key is absent."""
