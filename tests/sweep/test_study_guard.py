"""The study's work guard: the whole study estimated before any point runs, and
refused with the estimate and a remedy (``--max-events`` / ``--max-memory`` apply to
the study's total)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest

from clustersim.cli import main
from clustersim.scenario import apply_set, resolve
from clustersim.sim import estimate_run
from clustersim.sweep import guard
from clustersim.sweep.axes import expand
from clustersim.sweep.guard import StudyLimits, check_study_work
from clustersim.sweep.spec import load_study

from .conftest import GRID_STUDY

SEEDS_STUDY = """\
name: many-seeds
base: mini.yaml
axes:
  - grid: {parallelism.tp: [1, 2]}
  - seeds: 500
"""


def _per_point(study_path: Path) -> list[tuple[float, float]]:
    study = load_study(study_path)
    out = []
    for p in expand(study):
        data = copy.deepcopy(study.base)
        for assignment in p.overrides:
            apply_set(data, assignment)
        est = estimate_run(resolve(data))
        out.append((est.events, est.memory_bytes))
    return out


def test_the_estimate_is_the_sum_of_the_points_estimates(
    write_study: Callable[..., Path],
) -> None:
    path = write_study(GRID_STUDY)
    study = load_study(path)
    works = _per_point(path)
    est = check_study_work(study.base, expand(study), "auto", StudyLimits(), concurrent=2)
    assert est.points == 6
    assert est.events == pytest.approx(sum(e for e, _ in works), rel=1e-12)
    assert est.largest_events == max(e for e, _ in works)
    two_largest = sorted((m for _, m in works), reverse=True)[:2]
    assert est.memory_bytes == pytest.approx(sum(two_largest), rel=1e-12)


def test_points_alike_are_estimated_once(
    write_study: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = guard.resolve

    def counting(data: dict[str, object]) -> object:
        calls.append(1)
        return real(data)  # type: ignore[arg-type]

    monkeypatch.setattr(guard, "resolve", counting)
    study = load_study(write_study(SEEDS_STUDY))
    est = check_study_work(study.base, expand(study), "auto", StudyLimits(), concurrent=1)
    assert est.points == 1000
    assert len(calls) == 2  # one per TP degree: seeds change nothing the estimate reads


def test_a_study_over_the_limit_is_refused_before_any_point_runs(
    write_study: Callable[..., Path], study_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_study(SEEDS_STUDY)
    total = sum(e for e, _ in _per_point(path))
    out = study_dir / "out"
    argv = ["sweep", str(path), "--out", str(out), "--workers", "1", "--quiet"]
    assert main([*argv, "--max-events", f"{total / 2:g}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"clustersim: error: axes: this study would simulate about {total:.3g}")
    assert "1,000 points" in err and "--max-events" in err and "fewer points" in err
    assert not list((out / "points").glob("*.json"))  # nothing ran
    assert main([*argv, "--max-memory", "1KiB"]) == 2
    err = capsys.readouterr().err
    assert "memory" in err and "--max-memory" in err and "fewer workers" in err
    assert main([*argv, "--max-memory", "lots"]) == 2
    assert capsys.readouterr().err.startswith("clustersim: error: --max-memory:")


def test_finished_points_do_not_count_again(
    write_study: Callable[..., Path], study_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_study(GRID_STUDY)
    works = _per_point(path)
    out = study_dir / "o"
    base = ["sweep", str(path), "--out", str(out), "--workers", "1", "--quiet"]
    assert main(base) == 0
    # Every point is done: a rerun has nothing to estimate, whatever the limit.
    assert main([*base, "--max-events", f"{min(e for e, _ in works) / 2:g}"]) == 0


def test_nothing_to_run_is_nothing_to_refuse() -> None:
    est = check_study_work({"name": "x"}, [], "auto", StudyLimits(max_events=1), concurrent=4)
    assert (est.points, est.events, est.memory_bytes) == (0, 0.0, 0.0)


def test_a_point_that_will_fail_costs_nothing(write_study: Callable[..., Path]) -> None:
    # pp 3 does not divide 8 ranks: that point fails at once and is recorded so.
    study = load_study(write_study(GRID_STUDY.replace("[1, 2]", "[1, 3]")))
    est = check_study_work(study.base, expand(study), "auto", StudyLimits(), concurrent=1)
    assert est.points == 6 and est.events > 0
