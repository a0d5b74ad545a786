"""Validating a study's points up front, each distinct value of each section once.

A point is the base scenario with the study's ``set`` and its axis assignments
applied, and it is valid when ``scenario.resolve`` accepts it. Resolving every
point costs about a millisecond each (minutes for a large study), yet most of
that work repeats: in a grid over ``parallelism.tp`` and ``training.seq_len``
times 20 seeds, the ``parallelism`` section takes only as many values as there
are TP degrees.

``resolve`` checks the top-level sections of a scenario independently of one
another (each is its own pydantic model; the catalog lookups read ``cluster``
and ``model`` alone; ``lnc`` is checked against the chip, both in ``cluster``),
except for one bound on the text of the whole document. So a point is valid
exactly when, with the base and ``set`` valid, each of its sections is valid in
that background, and its total text is within the bound. Here:

1. the background (base with ``set``) is resolved once;
2. the sections the axes touch are gathered into groups (sections that the same
   axis varies together share a group when that means fewer checks), and every
   distinct value a group takes is resolved once, in the background;
3. a point whose group values all passed, and whose text cannot exceed the bound
   (the JSON length of each section is an upper bound on its text), is valid;
4. every other point is resolved whole, exactly as a worker would, so its error
   message is the one ``clustersim run`` gives.

When the background itself is invalid, or the base shares a value between two
sections (a YAML alias: an override of one would change the other), every point
is resolved whole. ``tests/sweep/test_check.py`` holds the decomposition to the
whole-point check on mixes of sections.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from clustersim.errors import ScenarioError
from clustersim.scenario import apply_set, resolve
from clustersim.scenario.yamlsafe import MAX_TOTAL_TEXT_CHARS
from clustersim.sweep.axes import Point
from clustersim.sweep.execute import PointTask, resolve_point
from clustersim.sweep.spec import Study, axis_size

__all__ = ["check_points"]

Progress = Callable[[int, int], None]
"""``(checks done, checks in all)``; the total may grow as the check goes on."""

_REPORT_EVERY_S = 0.1


def section_of(assignment: str) -> str:
    """The top-level scenario key an override sets (``parallelism`` of ``parallelism.tp=8``)."""
    return assignment.partition("=")[0].strip().split(".", 1)[0]


class _Ticker:
    """Calls the progress callback at most every ``_REPORT_EVERY_S`` (and at the end)."""

    def __init__(self, report: Progress | None, total: int) -> None:
        self.report, self.total, self.done = report, total, 0
        self._last = 0.0

    def tick(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if self.report is not None and (now - self._last >= _REPORT_EVERY_S):
            self._last = now
            self.report(self.done, self.total)

    def grow(self, n: int) -> None:
        self.total += n

    def finish(self) -> None:
        if self.report is not None:
            self.report(self.done, self.total)


def check_points(
    study: Study,
    points: Sequence[Point],
    progress: Progress | None = None,
    *,
    skip: Collection[str] = (),
) -> dict[str, ScenarioError]:
    """The points of ``study`` (all of ``expand(study)``, in order) that do not resolve,
    by id, with the error each gives; points whose id is in ``skip`` are left out."""
    ticker = _Ticker(progress, 0)
    suspects = _suspects(study, points, ticker)
    todo = list(points) if suspects is None else [points[i] for i in suspects]
    todo = [p for p in todo if p.id not in skip]
    ticker.grow(len(todo))
    errors: dict[str, ScenarioError] = {}
    for p in todo:
        try:
            resolve_point(PointTask(p.id, study.base, p.overrides))
        except ScenarioError as exc:
            errors[p.id] = exc
        ticker.tick()
    ticker.finish()
    return errors


def _suspects(study: Study, points: Sequence[Point], ticker: _Ticker) -> list[int] | None:
    """The indices of the points that may be invalid; None when each must be resolved."""
    entries = _axis_entries(study, points)
    if entries is None:
        return None
    fixed, per_axis = entries
    axes = _by_section(per_axis)
    groups = _groups(axes)
    distinct = [_distinct(axes, g) for g in groups]
    checks = sum(math.prod(len(d) for d in values) for values, _ in distinct)
    if checks + 1 >= len(points):
        return None  # nothing repeats: checking the points themselves is no dearer
    ticker.grow(checks + 1)
    background = copy.deepcopy(study.base)
    try:
        for assignment in fixed:
            apply_set(background, assignment)
        resolve(background)
    except ScenarioError:
        return None  # a typo in the base or `set`: every point says so in its own words
    ticker.tick()
    if _shares_values(background):
        return None
    verdicts: list[tuple[list[list[int]], list[int], list[int], list[int]]] = []
    for group, (values, index) in zip(groups, distinct, strict=True):
        bad: list[int] = []
        text: list[int] = []
        others = {k: v for k, v in background.items() if k not in group}
        for n, combo in enumerate(itertools.product(*values)):
            part = {s: copy.deepcopy(v) for s, v in background.items() if s in group}
            try:
                for texts in combo:
                    for assignment in texts:
                        apply_set(part, assignment)
                resolve({**others, **part})
            except ScenarioError:
                bad.append(n)
            text.append(_text_bound(part))
            ticker.tick()
        verdicts.append((index, [len(v) for v in values], bad, text))
    rest = _text_bound({k: v for k, v in background.items() if not any(k in g for g in groups)})
    worst = rest + sum(max(text) for *_, text in verdicts)
    if worst <= MAX_TOTAL_TEXT_CHARS and not any(bad for _, _, bad, _ in verdicts):
        return []
    # Some group value failed (or the text may pass the bound): find the points that
    # take it, by their entry along each axis.
    suspect = np.zeros(len(points), dtype=bool)
    total = np.full(len(points), rest, dtype=np.int64)
    entry = _entry_indices([len(axis) for axis in per_axis], len(points))
    for index, radix, bad, text in verdicts:
        variant = np.zeros(len(points), dtype=np.int64)
        for a, (positions, n) in enumerate(zip(index, radix, strict=True)):
            variant = variant * n + np.asarray(positions, dtype=np.int64)[entry[a]]
        suspect |= np.isin(variant, np.asarray(bad, dtype=np.int64))
        total += np.asarray(text, dtype=np.int64)[variant]
    suspect |= total > MAX_TOTAL_TEXT_CHARS
    return [int(i) for i in np.flatnonzero(suspect)]


def _axis_entries(
    study: Study, points: Sequence[Point]
) -> tuple[tuple[str, ...], list[list[tuple[str, ...]]]] | None:
    """The study's ``set`` overrides and, per axis, each entry's overrides, read off the
    points (the product of the axes in order, the first varying slowest)."""
    axes = study.spec.axes
    sizes = [axis_size(a) for a in axes]
    widths = [len(a.varied_keys()) for a in axes]
    n_fixed = len(study.spec.set)
    if math.prod(sizes) != len(points) or any(
        len(p.overrides) != n_fixed + sum(widths) for p in points
    ):
        return None  # not the layout this module knows: resolve every point
    fixed = points[0].overrides[:n_fixed] if points else ()
    per_axis: list[list[tuple[str, ...]]] = []
    stride = len(points)
    start = n_fixed
    for size, width in zip(sizes, widths, strict=True):
        stride //= size
        per_axis.append([points[e * stride].overrides[start : start + width] for e in range(size)])
        start += width
    return fixed, per_axis


def _shares_values(data: dict[str, Any]) -> bool:
    """True if two top-level sections hold the same mapping or list (a YAML alias)."""
    owner: dict[int, str] = {}
    for section, value in data.items():
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, dict | list):
                if owner.setdefault(id(item), section) != section:
                    return True
                stack.extend(item.values() if isinstance(item, dict) else item)
    return False


Axis = list[dict[str, tuple[str, ...]]]
"""One axis: per entry, its overrides by the section they set (in their order)."""


def _by_section(per_axis: list[list[tuple[str, ...]]]) -> list[Axis]:
    out: list[Axis] = []
    for axis in per_axis:
        entries: Axis = []
        for entry in axis:
            parts: dict[str, list[str]] = {}
            for assignment in entry:
                parts.setdefault(section_of(assignment), []).append(assignment)
            entries.append({k: tuple(v) for k, v in parts.items()})
        out.append(entries)
    return out


def _sub(entry: dict[str, tuple[str, ...]], group: Sequence[str]) -> tuple[str, ...]:
    """The entry's overrides in ``group`` (sorted): overrides of different sections
    commute, so this order gives the same scenario as the written one."""
    return tuple(a for s in group for a in entry.get(s, ()))


def _distinct(
    axes: list[Axis], group: frozenset[str]
) -> tuple[list[list[tuple[str, ...]]], list[list[int]]]:
    """Per axis: the distinct overrides it makes in ``group`` and, per entry, which."""
    ordered = sorted(group)
    distinct: list[list[tuple[str, ...]]] = []
    index: list[list[int]] = []
    for axis in axes:
        seen: dict[tuple[str, ...], int] = {}
        index.append([seen.setdefault(_sub(e, ordered), len(seen)) for e in axis])
        distinct.append(list(seen))
    return distinct, index


def _groups(axes: list[Axis]) -> list[frozenset[str]]:
    """The sections the axes touch, merged while a merge saves checks (keys drawn
    together by a random axis take as many values jointly as each alone)."""
    sections = sorted({s for axis in axes for e in axis for s in e})
    # Each entry's overrides of each section as a small number, so that counting the
    # distinct values of a group is counting tuples of numbers.
    codes: list[list[dict[str, int]]] = []
    for axis in axes:
        seen: dict[tuple[str, tuple[str, ...]], int] = {}
        codes.append(
            [{s: seen.setdefault((s, e.get(s, ())), len(seen)) for s in sections} for e in axis]
        )

    def cost(group: frozenset[str]) -> int:
        ordered = sorted(group)
        return math.prod(len({tuple(c[s] for s in ordered) for c in axis}) for axis in codes)

    groups = [frozenset({s}) for s in sections]
    costs = {g: cost(g) for g in groups}
    while len(groups) > 1:
        best: tuple[int, int, int] | None = None
        for i, j in itertools.combinations(range(len(groups)), 2):
            merged = groups[i] | groups[j]
            if merged not in costs:
                costs[merged] = cost(merged)
            saving = costs[groups[i]] + costs[groups[j]] - costs[merged]
            if saving > 0 and (best is None or saving > best[0]):
                best = (saving, i, j)
        if best is None:
            break
        _, i, j = best
        groups = [g for k, g in enumerate(groups) if k not in (i, j)] + [groups[i] | groups[j]]
    return groups


def _text_bound(sections: dict[str, Any]) -> int:
    """At least the characters of keys and text the sections hold: each appears whole in
    their JSON (aliases written out again, as the scenario's bound counts them)."""
    return sum(
        len(json.dumps({k: v}, ensure_ascii=False, default=str)) for k, v in sections.items()
    )


def _entry_indices(sizes: list[int], n: int) -> list[np.ndarray[Any, np.dtype[np.int64]]]:
    """For each axis, the entry of every point (the first axis varying slowest)."""
    out = []
    stride = n
    at = np.arange(n, dtype=np.int64)
    for size in sizes:
        stride //= size
        out.append((at // stride) % size)
    return out
