"""Hostile study files: every mutation of a valid study is accepted or refused as a
``ScenarioError`` (exit 2, one line with the key path), never anything else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from strategies import dump, tree_mutations

from clustersim.errors import ScenarioError
from clustersim.sweep import expand, parse_study
from clustersim.sweep.execute import PointTask, resolve_point

from .conftest import MINI

STUDY: dict[str, Any] = {
    "name": "hostile",
    "description": "every kind of axis",
    "base": yaml.safe_load(MINI),
    "set": {"training.steps": 1},
    "axes": [
        {"grid": {"parallelism.tp": [1, 2], "parallelism.pp": [1, 2]}},
        {"zip": {"name": ["a", "b"], "cluster.count": [1, 2]}},
        {"random": {"n": 2, "seed": 3, "keys": {
            "cluster.chip.calibration.link_efficiency": {"uniform": [0.5, 0.9], "round": 3},
            "training.seq_len": {"choice": [128, 256]},
            "cluster.efa.bandwidth_Bps": {"loguniform": [1e10, 1e12]},
            "parallelism.microbatch_size": {"integers": [1, 2]},
        }}},
        {"seeds": {"n": 2, "start": 5}},
    ],
    "run": {"fidelity": "detailed", "max_events": 1e6, "max_memory": "1GiB"},
    "report": {"train_tokens": 1e9, "metrics": ["step_time_s", "mfu"]},
}  # fmt: skip


def test_the_unmutated_study_is_valid() -> None:
    points = expand(parse_study(dump(STUDY)))
    assert len(points) == 4 * 2 * 2 * 2
    resolve_point(PointTask(points[0].id, STUDY["base"], points[0].overrides))


@settings(max_examples=120)
@given(tree_mutations(bases={"study": STUDY}))
def test_mutated_studies_are_accepted_or_refused_with_a_key_path(
    case: tuple[str, Any, list[Any]],
) -> None:
    _, tree, _ = case
    try:
        text = dump(tree)
    except (yaml.YAMLError, ValueError, TypeError, RecursionError):
        return  # not representable as YAML: not an input anyone can write
    try:
        study = parse_study(text)
        points = expand(study)
    except ScenarioError as exc:
        message = str(exc)
        assert "\n" not in message and len(message) < 2000
        return
    for p in points[:2]:  # each point is a scenario: valid, or a ScenarioError
        try:
            resolve_point(PointTask(p.id, study.base, p.overrides))
        except ScenarioError as exc:
            assert "\n" not in str(exc)


@pytest.mark.parametrize(
    "text",
    [
        "a: &a [1, 2]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n" * 1 + "name: x\nbase: {}\n",
        "!!python/object:os.system {}\n",
        "name: x\nname: y\nbase: {}\n",
        "name: x\nbase: {}\naxes: [{grid: {a: [" + ", ".join(["1"] * 200_000) + "]}}]\n",
        "name: x\nbase: {}\naxes:\n" + "".join(f"  - grid: {{k{i}: [1, 2]}}\n" for i in range(30)),
        "\x00\x01",
    ],
)
def test_hostile_documents_are_refused_quickly(text: str, tmp_path: Path) -> None:
    with pytest.raises(ScenarioError) as info:
        expand(parse_study(text))
    assert "\n" not in str(info.value)
