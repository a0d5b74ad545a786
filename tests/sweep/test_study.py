"""Running studies: results equal separate runs, failures are recorded, reruns resume,
and the worker count changes nothing."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from clustersim.cli import main
from clustersim.errors import ScenarioError
from clustersim.sweep import load_study
from clustersim.sweep.execute import LocalExecutor
from clustersim.sweep.run import StudyOutcome, run_study
from clustersim.sweep.store import RESULTS, flatten

from .conftest import GRID_STUDY, VOLATILE


def _run(path: Path, out: Path, workers: int = 1, **kw: bool) -> StudyOutcome:
    return run_study(load_study(path), out, lambda: LocalExecutor(workers), **kw)


def _stable(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=[c for c in VOLATILE if c in frame.columns])


def test_grid_results_equal_separate_runs(
    write_study: Callable[..., Path], study_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_study(GRID_STUDY)
    assert main(["sweep", str(path), "--out", str(study_dir / "out"), "--workers", "1"]) == 0
    assert "study mini-grid" in capsys.readouterr().out
    frame = pd.read_parquet(study_dir / "out" / RESULTS)
    assert list(frame["index"]) == list(range(6))
    assert list(frame["status"]) == ["ok"] * 6
    assert list(frame.columns[:4]) == ["point", "index", "parallelism.tp", "parallelism.pp"]
    for row in frame.to_dict("records"):
        out = study_dir / f"run-{row['index']}"
        sets = [
            f"parallelism.tp={row['parallelism.tp']}",
            f"parallelism.pp={row['parallelism.pp']}",
        ]
        args = ["run", str(study_dir / "mini.yaml"), "--out", str(out), "--quiet", "--no-report"]
        assert main(args + [a for s in sets for a in ("--set", s)]) == 0
        summary = flatten(json.loads((out / "summary.json").read_text()))
        for key, value in summary.items():
            if key in VOLATILE:
                continue
            assert row[key] == value, key  # bit for bit: the same simulation
        assert row["layout.tp"] == row["parallelism.tp"]


def test_failed_points_are_recorded_and_do_not_stop_the_study(
    write_study: Callable[..., Path], study_dir: Path
) -> None:
    path = write_study(
        "name: with-failures\nbase: mini.yaml\n"
        "axes: [{grid: {parallelism.tp: [2, 3, 16], cluster.lnc: [1]}}]\n"
    )
    outcome = _run(path, study_dir / "out")
    assert (outcome.points, outcome.ok, outcome.failed) == (3, 1, 2)
    frame = pd.read_parquet(study_dir / "out" / RESULTS)
    assert list(frame["status"]) == ["ok", "failed", "failed"]
    assert pd.isna(frame["error"][0])
    assert "parallelism.tp" in frame["error"][1]  # 8 heads are not divisible by 3
    assert "parallelism.tp" in frame["error"][2]
    assert math.isnan(frame["step_time_s"][1]) and frame["step_time_s"][0] > 0
    record = json.loads((study_dir / "out" / "points" / f"{frame['point'][1]}.json").read_text())
    assert record["status"] == "failed" and record["overrides"][0] == "parallelism.tp=3"


def test_every_point_invalid_is_bad_input(
    write_study: Callable[..., Path], study_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_study("name: typo\nbase: mini.yaml\nset: {parallelism.tpp: 2}\n")
    assert main(["sweep", str(path), "--out", str(study_dir / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "parallelism.tpp: unknown key" in err


def test_rerun_skips_finished_points_and_extends(
    write_study: Callable[..., Path], study_dir: Path
) -> None:
    path = write_study(GRID_STUDY)
    out = study_dir / "out"
    first = _run(path, out)
    mtimes = {p.name: p.stat().st_mtime_ns for p in (out / "points").iterdir()}
    again = _run(path, out)
    assert (again.skipped, again.ran) == (6, 0)
    assert {p.name: p.stat().st_mtime_ns for p in (out / "points").iterdir()} == mtimes
    pd.testing.assert_frame_equal(first.frame, again.frame)
    # A wider study in the same directory runs only the new points.
    write_study(GRID_STUDY.replace("[1, 2, 4]", "[1, 2, 4, 8]"))
    wider = _run(path, out)
    assert (wider.skipped, wider.ran, wider.points) == (6, 2, 8)


def test_worker_count_does_not_change_results(
    write_study: Callable[..., Path], study_dir: Path
) -> None:
    path = write_study(GRID_STUDY)
    one = _run(path, study_dir / "one", workers=1)
    two = _run(path, study_dir / "two", workers=2)
    assert two.executor == "local pool, 2 workers"
    pd.testing.assert_frame_equal(_stable(one.frame), _stable(two.frame))


def test_out_refuses_another_study_unless_forced(
    write_study: Callable[..., Path], study_dir: Path
) -> None:
    out = study_dir / "out"
    _run(write_study(GRID_STUDY.replace("parallelism.pp: [1, 2]", "parallelism.pp: [1]")), out)
    other = write_study(GRID_STUDY.replace("mini-grid", "other"), "other.yaml")
    with pytest.raises(ScenarioError, match="holds the results of study 'mini-grid'"):
        _run(other, out)
    forced = _run(other, out, force=True)
    assert forced.skipped == 0 and len(list((out / "points").glob("*.json"))) == 6
    run_dir = study_dir / "a-run"
    assert main(["run", str(study_dir / "mini.yaml"), "--out", str(run_dir), "--quiet",
                 "--no-report"]) == 0  # fmt: skip
    with pytest.raises(ScenarioError, match="clustersim run"):
        _run(other, run_dir)


def test_keep_runs_writes_run_directories(
    write_study: Callable[..., Path], study_dir: Path
) -> None:
    path = write_study("name: keep\nbase: mini.yaml\nset: {output.html: false}\n")
    outcome = _run(path, study_dir / "out", keep_runs=True)
    (point,) = list(outcome.frame["point"])
    run = study_dir / "out" / "runs" / point
    summary = json.loads((run / "summary.json").read_text())
    assert summary["step_time_s"] == outcome.frame["step_time_s"][0]
    assert (run / "trace.parquet").exists() and (run / "resolved_scenario.yaml").exists()


def test_train_tokens_adds_time_to_train(write_study: Callable[..., Path], study_dir: Path) -> None:
    path = write_study("name: ttt\nbase: mini.yaml\nreport: {train_tokens: 3.6e9}\n")
    row = _run(path, study_dir / "out").frame.iloc[0]
    assert row["time_to_train_h"] == pytest.approx(3.6e9 / row["tokens_per_s"] / 3600)


EXAMPLES = ("trn2-llama3-8b-tp-microbatch", "p5-llama3-8b-checkpoint-montecarlo")


@pytest.mark.slow
def test_example_studies_run(tmp_path: Path) -> None:
    """The example studies run to the end with their failures recorded (minutes)."""
    root = Path(__file__).parents[2] / "scenarios" / "studies"
    for name in EXAMPLES:
        path = root / f"{name}.yaml"
        out = tmp_path / path.stem
        outcome = run_study(load_study(path), out, lambda: LocalExecutor(None))
        assert outcome.ok > 0 and outcome.points == outcome.ok + outcome.failed
        assert main(["report", str(out)]) == 0


@pytest.mark.slow
def test_cli_dask_local_processes(write_study: Callable[..., Path], study_dir: Path) -> None:
    """``--dask-local`` with worker processes, as users run it."""
    path = write_study(GRID_STUDY)
    assert main(["sweep", str(path), "--out", str(study_dir / "d"), "--dask-local", "2",
                 "--quiet"]) == 0  # fmt: skip
    local = _run(path, study_dir / "l")
    dask = pd.read_parquet(study_dir / "d" / RESULTS)
    pd.testing.assert_frame_equal(_stable(local.frame), _stable(dask))
