"""The up-front check: each distinct section value resolved once, yet exactly the points
that fail to resolve are reported, with the message a whole-point resolve gives."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

import clustersim.scenario.load
import clustersim.sweep.check
from clustersim.errors import ScenarioError
from clustersim.sweep import expand, load_study
from clustersim.sweep.axes import Point, _dump_checked, yaml_value
from clustersim.sweep.check import check_points
from clustersim.sweep.command import RichProgress
from clustersim.sweep.execute import PointTask, resolve_point
from clustersim.sweep.run import StudyProgress, run_study
from clustersim.sweep.spec import Study

from .conftest import MINI


def _whole(study: Study) -> dict[str, str]:
    """The reference: every point resolved on its own."""
    errors = {}
    for p in expand(study):
        try:
            resolve_point(PointTask(p.id, study.base, p.overrides))
        except ScenarioError as exc:
            errors[p.id] = str(exc)
    return errors


def _checked(study: Study) -> dict[str, str]:
    return {k: str(v) for k, v in check_points(study, expand(study)).items()}


def _counting_resolve(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = clustersim.sweep.check.resolve

    def counted(data: dict[str, Any]) -> Any:
        calls[0] += 1
        return real(data)

    monkeypatch.setattr(clustersim.sweep.check, "resolve", counted)
    return calls


MIXED = """\
name: mixed
base: mini.yaml
axes:
  - grid:
      cluster.instance: [p5.48xlarge, trn2.48xlarge]
      cluster.lnc: [1, 2]                       # p5 has lnc 1 only
  - grid:
      model.layers: [2, -1]
      parallelism.tp: [1, 0]
  - zip:
      training.precision: [bf16, fp12, fp8]
      parallelism.pp: [1, 1, 2]
  - random:
      n: 6
      seed: 4
      keys:
        cost.pue: {choice: [1.2, 1.3, 0.5]}         # below 1 is invalid
        training.steps: {integers: [995, 1001]}  # above 1000 is invalid
  - seeds: 2
"""


def test_the_check_reports_exactly_the_points_a_whole_resolve_refuses(
    write_study: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    study = load_study(write_study(MIXED))
    points = expand(study)
    reference = _whole(study)
    assert 0 < len(reference) < len(points)  # valid and invalid points both
    calls = _counting_resolve(monkeypatch)
    assert _checked(study) == reference
    assert calls[0] < len(points)


@pytest.mark.parametrize(
    "study_set",
    [
        "{parallelism.tpp: 2}",  # a typo in set: every point is invalid
        "{training.seq_len: -1}",
        "{parallelism: {tp: -1}}",  # mended by the axis setting parallelism.tp
    ],
)
def test_an_invalid_background_is_checked_point_by_point(
    write_study: Callable[..., Path], study_set: str
) -> None:
    study = load_study(write_study(MIXED.replace("axes:\n", f"set: {study_set}\naxes:\n", 1)))
    reference = _whole(study)
    assert reference and _checked(study) == reference


def _text_needed(study: Study, point: Point, monkeypatch: pytest.MonkeyPatch) -> int:
    """The least text bound the point's scenario passes (found by bisection)."""
    lo, hi = 0, 10**6
    while lo < hi:
        mid = (lo + hi) // 2
        monkeypatch.setattr(clustersim.scenario.load, "MAX_TOTAL_TEXT_CHARS", mid)
        try:
            resolve_point(PointTask(point.id, study.base, point.overrides))
            hi = mid
        except ScenarioError:
            lo = mid + 1
    return lo


def test_text_adding_up_across_sections_past_the_bound_is_caught(
    write_study: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    study = load_study(
        write_study(
            "name: long\nbase: mini.yaml\naxes:\n"
            f"  - grid: {{name: [a, {'n' * 150}]}}\n"
            f"  - grid: {{output.dir: [b, {'d' * 300}]}}\n"
            "  - seeds: 3\n"
        )
    )
    points = expand(study)
    # A bound that each long value passes alone, but not both together.
    limit = max(_text_needed(study, points[i], monkeypatch) for i in (3, 6))
    monkeypatch.setattr(clustersim.scenario.load, "MAX_TOTAL_TEXT_CHARS", limit)
    monkeypatch.setattr(clustersim.sweep.check, "MAX_TOTAL_TEXT_CHARS", limit)
    reference = _whole(study)
    assert len(reference) == 3 and all("adds up to more than" in e for e in reference.values())
    assert _checked(study) == reference


def test_a_base_sharing_a_value_between_sections_is_checked_point_by_point(
    study_dir: Path, write_study: Callable[..., Path]
) -> None:
    # One alias for two sections: an override of one changes the other too.
    (study_dir / "mini.yaml").write_text(MINI + "output: &empty {}\ncost: *empty\n")
    study = load_study(
        write_study(
            "name: alias\nbase: mini.yaml\naxes:\n  - grid: {output.trace: [false]}\n  - seeds: 4\n"
        )
    )
    reference = _whole(study)
    assert len(reference) == 4 and all("cost.trace" in e for e in reference.values())
    assert _checked(study) == reference


LARGE = """\
name: large
base: mini.yaml
axes:
  - grid:
      parallelism.tp: [1, 2]
      parallelism.microbatch_size: [1, 2, 4]
  - grid:
      training.seq_len: [128, 256]
      training.global_batch_size: [8, 16]
  - grid:
      seed: [{seeds}]
"""


class _Instant:
    """An executor that returns every task as done without simulating it."""

    description = "instant"

    def __init__(self) -> None:
        self.ran = 0

    def run(self, tasks: Sequence[PointTask]) -> Iterator[dict[str, Any]]:
        for task in tasks:
            self.ran += 1
            yield {"id": task.id, "status": "ok", "error": None, "summary": {}, "wall_s": 0.0}

    def close(self) -> None: ...


class _Recorder(StudyProgress):
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def validating(self, done: int, total: int) -> None:
        self.calls.append(("validating", done, total))

    def start(self, total: int, done: int, failed: int, executor: str) -> None:
        self.calls.append(("start", total, done))


def test_a_bad_value_in_a_large_study_is_caught_up_front(
    write_study: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    seeds = ", ".join(map(str, range(1000))) + ", -1"  # one bad seed among 1,001
    study = load_study(write_study(LARGE.format(seeds=seeds)))
    points = expand(study)
    assert len(points) == 24 * 1001
    calls = _counting_resolve(monkeypatch)
    invalid = check_points(study, points)
    assert calls[0] < 1100  # about one check per distinct value, not one per point
    assert sorted(invalid) == sorted(p.id for p in points if p.values["seed"] == -1)
    for error in invalid.values():
        assert (error.path, error.value) == ("seed", -1)


def test_a_study_records_its_invalid_points_and_runs_the_rest(
    write_study: Callable[..., Path], study_dir: Path
) -> None:
    seeds = ", ".join(map(str, range(50))) + ", -1"
    study = load_study(write_study(LARGE.format(seeds=seeds)))
    executor, progress = _Instant(), _Recorder()
    outcome = run_study(study, study_dir / "out", lambda: executor, progress=progress)
    assert (outcome.points, outcome.failed, executor.ran) == (24 * 51, 24, 24 * 50)
    for failure in outcome.failures:
        assert failure["values"]["seed"] == -1 and failure["error_kind"] == "input"
        assert failure["error"].startswith("seed: ") and "(got -1)" in failure["error"]
    assert outcome.first_input_error is not None
    kinds = [c[0] for c in progress.calls]
    assert kinds[-1] == "start" and "validating" in kinds
    last = [c for c in progress.calls if c[0] == "validating"][-1]
    assert last[1] == last[2]  # the check reports its end
    # A rerun checks only what is left: nothing.
    again = run_study(study, study_dir / "out", lambda: executor, progress=progress)
    assert (again.skipped, again.ran, executor.ran) == (24 * 51, 0, 24 * 50)


def test_the_validating_bar_shows_only_when_the_check_takes_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    progress = RichProgress(Console(file=io.StringIO(), force_terminal=True))
    progress.validating(1, 10)
    assert progress._bar is None  # a moment: no bar
    monkeypatch.setattr("clustersim.sweep.command.VALIDATING_DELAY_S", 0.0)
    progress.validating(2, 10)
    assert progress._bar is not None
    progress.start(10, 0, 0, "local pool, 1 worker")  # replaces it with the points bar
    progress.close()
    assert progress._bar is None


@given(st.floats(allow_nan=False) | st.integers(-(2**70), 2**70) | st.booleans() | st.text())
def test_set_texts_of_scalars_are_what_pyyaml_writes(value: object) -> None:
    try:
        expected = _dump_checked(value, "x")
    except ScenarioError:
        with pytest.raises(ScenarioError):
            yaml_value(value, "x")
        return
    assert yaml_value(value, "x") == expected
    assert yaml_value(value, "x") == expected  # and again, from the cache
