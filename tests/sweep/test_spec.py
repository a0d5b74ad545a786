"""Study files: validation with key paths, and how each kind of axis expands."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from clustersim.cli import main
from clustersim.errors import ScenarioError
from clustersim.sweep import expand, load_study, parse_study
from clustersim.sweep.axes import yaml_value

BASE = "name: t\nbase: {name: x}\n"


def _points(text: str) -> list[dict[str, object]]:
    return [p.values for p in expand(parse_study(BASE + text))]


def test_grid_is_the_cartesian_product_first_key_slowest() -> None:
    values = _points("axes: [{grid: {a.b: [1, 2], c: [x, y, z]}}]")
    assert values == [{"a.b": a, "c": c} for a in (1, 2) for c in ("x", "y", "z")]


def test_zip_moves_in_lockstep_and_axes_multiply() -> None:
    values = _points("axes: [{zip: {a: [1, 2, 3], b: [p, q, r]}}, {seeds: 2}]")
    assert values == [
        {"a": a, "b": b, "seed": s} for a, b in ((1, "p"), (2, "q"), (3, "r")) for s in (0, 1)
    ]


def test_seeds_axis_sets_the_seed_key() -> None:
    assert _points("axes: [{seeds: 3}]") == [{"seed": 0}, {"seed": 1}, {"seed": 2}]
    started = _points("axes: [{seeds: {n: 2, start: 100}}]")
    assert started == [{"seed": 100}, {"seed": 101}]
    pts = expand(parse_study(BASE + "axes: [{seeds: 2}]"))
    assert pts[1].overrides == ("seed=1",)


RANDOM = """\
axes:
  - random:
      n: 200
      seed: {seed}
      keys:
        u: {{uniform: [0.5, 0.9], round: 3}}
        lg: {{loguniform: [1.0e9, 1.0e12]}}
        nm: {{normal: [10, 2]}}
        i: {{integers: [1, 4]}}
        c: {{choice: [a, 7, {{k: v}}]}}
"""


def test_random_axis_is_deterministic_per_seed_and_in_range() -> None:
    first, again = _points(RANDOM.format(seed=5)), _points(RANDOM.format(seed=5))
    assert first == again
    assert first != _points(RANDOM.format(seed=6))
    u = [float(p["u"]) for p in first]  # type: ignore[arg-type]
    assert all(0.5 <= x <= 0.9 and round(x, 3) == x for x in u)
    lg = [float(p["lg"]) for p in first]  # type: ignore[arg-type]
    assert all(1e9 <= x <= 1e12 for x in lg)
    assert min(lg) < 1e10 and max(lg) > 1e11  # spread over the decades, not linearly
    ints = {p["i"] for p in first}
    assert ints == {1, 2, 3, 4}  # both ends included
    assert {str(p["c"]) for p in first} == {"a", "7", "{'k': 'v'}"}
    nm = [float(p["nm"]) for p in first]  # type: ignore[arg-type]
    assert 9.5 < sum(nm) / len(nm) < 10.5


def test_point_ids_are_stable_and_depend_on_the_base() -> None:
    text = "axes: [{grid: {a: [1, 2]}}]"
    ids = [p.id for p in expand(parse_study(BASE + text))]
    assert ids == [p.id for p in expand(parse_study(BASE + text))]
    assert len(set(ids)) == 2
    other = [p.id for p in expand(parse_study("name: t\nbase: {name: y}\n" + text))]
    assert not set(ids) & set(other)


@pytest.mark.parametrize(
    "value", [4, 0.85, 1.0e20, "2.9TB/s", "1e3", "", None, True, [1, "a"], {"k": [1.5]}, "a: b"]
)
def test_values_round_trip_through_set_text(value: object) -> None:
    from clustersim.scenario.load import parse_yaml

    assert parse_yaml(yaml_value(value, "x"), "x") == value


@pytest.mark.parametrize(
    ("text", "path", "words"),
    [
        ("nme: t\nbase: {}\n", "nme", "did you mean 'name'"),
        ("name: t\n", "base", "required"),
        (BASE + "axes: [{grid: {a: [1]}, zip: {b: [1]}}]", "axes.0", "exactly one"),
        (BASE + "axes: [{zip: {a: [1], b: [1, 2]}}]", "axes.0", "same length"),
        (BASE + "axes: [{grid: {a: []}}]", "axes.0", "1 to"),
        (BASE + "axes: [{grid: {a: [1]}}, {grid: {a: [2]}}]", "axes.1.grid", "already varied"),
        (BASE + "set: {a: 1}\naxes: [{grid: {a: [2]}}]", "axes.0.grid", "also fixed"),
        (BASE + "axes: [{random: {n: 2, keys: {a: {uniform: [2, 1]}}}}]", "axes.0.random.keys.a",
         "low end"),
        (BASE + "axes: [{random: {n: 2, keys: {a: {uniform: [0, 1], normal: [0, 1]}}}}]",
         "axes.0.random.keys.a", "exactly one"),
        (BASE + "axes: [{seeds: 0}]", "axes.0", "seeds"),
        (BASE + "axes: [{grid: {'a..b': [1]}}]", "axes.0", "dotted"),
        (BASE + "run: {fidelity: fast}", "run.fidelity", "auto"),
        (BASE + "run: {max_memory: 8 GiBB}", "run.max_memory", ""),
        (BASE + "report: {metricz: []}", "report.metricz", "unknown key"),
        ("- a\n- b\n", "", "mapping"),
        ("name: t\nbase: [1]\n", "base", ""),
    ],
)  # fmt: skip
def test_bad_study_names_the_key_path(text: str, path: str, words: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_study(text)
    assert info.value.path == path
    assert words in str(info.value)


def test_base_path_is_relative_to_the_study_file(write_study: Callable[..., Path]) -> None:
    path = write_study("name: s\nbase: mini.yaml\n")
    study = load_study(path)
    assert study.base["name"] == "mini" and study.base_label == "mini.yaml"
    assert len(expand(study)) == 1  # no axes: the base itself


def test_cli_bad_study_exits_2_with_one_line(
    write_study: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write_study("name: s\nbase: mini.yaml\naxes: [{grid: {parallelism.tp: 4}}]\n")
    assert main(["sweep", str(bad), "--out", str(bad.parent / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("clustersim: error: axes.0.grid.parallelism.tp")
    missing = write_study("name: s\nbase: nowhere.yaml\n")
    assert main(["sweep", str(missing)]) == 2
    assert "base: base file not found" in capsys.readouterr().err
    assert main(["sweep", str(bad.parent / "absent.yaml")]) == 2
    assert "study file not found" in capsys.readouterr().err


def test_example_studies_expand_and_resolve() -> None:
    """Every example study is valid, and each point's scenario resolves (or fails for a
    reason the study means to show, as a recorded point)."""
    from clustersim.sweep.execute import PointTask, resolve_point

    root = Path(__file__).parents[2] / "scenarios" / "studies"
    studies = sorted(root.glob("*.yaml"))
    assert studies
    for path in studies:
        study = load_study(path)
        points = expand(study)
        assert points and len({p.id for p in points}) == len(points)
        for p in points:
            resolve_point(PointTask(p.id, study.base, p.overrides))


def test_a_base_outside_the_study_and_working_directories_needs_allow_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "base.yaml").write_text("name: x\n")
    studies = tmp_path / "project" / "studies"
    studies.mkdir(parents=True)
    monkeypatch.chdir(studies)
    text = "name: t\nbase: ../../elsewhere/base.yaml\naxes: [{seeds: 2}]\n"
    with pytest.raises(ScenarioError) as info:
        parse_study(text, source=studies / "s.yaml")
    assert info.value.path == "base"
    assert "--allow-outside" in str(info.value)
    study = parse_study(text, source=studies / "s.yaml", allow_outside=True)
    assert study.base == {"name": "x"}
