"""Injections in whole runs: straggling, a failed step, the CLI, folding, determinism."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from scenario_texts import TINY

from clustersim.cli import main
from clustersim.errors import PartitionError, ScenarioError
from clustersim.scenario import load_scenario
from clustersim.sim import Result, simulate

SMALL = TINY.replace("global_batch_size: 32", "global_batch_size: 8")


def with_failures(text: str, failures: str) -> str:
    return text + f"failures: {failures}\n"


def run(text: str, **kw: Any) -> Result:
    return simulate(load_scenario(text), **kw)


@pytest.fixture(scope="module")
def healthy() -> Result:
    return run(SMALL)


def compute_rows(result: Result) -> pd.DataFrame:
    trace = result.trace_frame()
    return trace[trace["resource"].isin(["tensor", "vector", "scalar", "gpsimd", "hbm"])]


def test_straggle_everywhere_scales_every_compute_op(healthy: Result) -> None:
    f = 1.5
    slow = run(
        with_failures(SMALL, f"{{inject: [{{target: {{instance: 0}}, kind: {{straggle: {f}}}}}]}}")
    )
    hb, sb = healthy.summary["breakdown_s"], slow.summary["breakdown_s"]
    assert sb["compute"] == pytest.approx(f * hb["compute"], rel=1e-12)
    assert sb["optimizer"] == pytest.approx(f * hb["optimizer"], rel=1e-12)
    a, b = compute_rows(healthy), compute_rows(slow)
    assert len(a) == len(b) > 0
    dur_a = (a["end_s"] - a["start_s"]).to_numpy()
    dur_b = (b["end_s"] - b["start_s"]).to_numpy()
    np.testing.assert_allclose(dur_b, f * dur_a, rtol=1e-9, atol=1e-15)
    assert slow.summary["step_time_s"] > healthy.summary["step_time_s"]
    (rec,) = slow.summary["injections"]
    assert rec["name"] == "instance0" and rec["kind"] == "straggle" and rec["factor"] == f


def test_straggle_from_a_time_on_one_chip(healthy: Result) -> None:
    # Chip 1 computes twice as slow from the middle of the step: the ops of its ranks
    # that start after that last twice as long; every other chip's ops keep theirs.
    t = healthy.summary["step_time_s"] / 2
    slow = run(
        with_failures(
            SMALL, f"{{inject: [{{at: {t}, target: {{chip: 1}}, kind: {{straggle: 2}}}}]}}"
        )
    )
    a, b = compute_rows(healthy), compute_rows(slow)
    dur_a = (a["end_s"] - a["start_s"]).to_numpy()
    dur_b = (b["end_s"] - b["start_s"]).to_numpy()
    on_chip = (b["chip"] == 1).to_numpy()
    late = on_chip & (b["start_s"] >= t).to_numpy()
    np.testing.assert_allclose(dur_b[~on_chip], dur_a[~on_chip], rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(dur_b[late], 2 * dur_a[late], rtol=1e-9, atol=1e-15)
    assert late.any()
    assert slow.summary["step_time_s"] > healthy.summary["step_time_s"]


def test_chip_down_fails_the_step(healthy: Result, tmp_path: Path, capsys: Any) -> None:
    t = round(healthy.summary["step_time_s"] / 3, 9)
    path = tmp_path / "fail.yaml"
    path.write_text(with_failures(SMALL, f"{{inject: [{{at: {t}, target: {{chip: 3}}}}]}}"))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "failed at" in printed and "chip3 down" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step_failed"] == {"at_s": t, "step": 0, "cause": "chip3 down", "injection": 0}
    assert summary["steps_completed"] == 0 and summary["step_times_s"] == []
    assert summary["step_time_s"] is None and summary["mfu"] is None
    trace = pd.read_parquet(out / "trace.parquet")
    assert len(trace) > 0 and trace["end_s"].max() <= t
    assert not trace[["start_s", "end_s"]].isna().any().any()
    injections = pd.read_parquet(out / "injections.parquet")
    assert injections.loc[0, "effect"] == "step failed"
    assert injections.loc[0, "applied_s"] == t
    assert not (out / "report.html").exists()
    capsys.readouterr()
    assert main(["report", str(out)]) == 2  # no finished step to report on
    assert "a report needs a finished step" in capsys.readouterr().err


def test_instance_down_in_a_later_step(healthy: Result) -> None:
    step = healthy.summary["step_time_s"]
    text = SMALL.replace("steps: 1", "steps: 2")
    result = run(
        with_failures(text, f"{{inject: [{{at: {1.5 * step}, target: {{instance: 0}}}}]}}")
    )
    s = result.summary
    assert s["step_failed"]["step"] == 1 and s["steps_completed"] == 1
    assert s["step_times_s"] == [pytest.approx(step, rel=1e-12)]
    assert s["step_failed"]["cause"] == "instance0 down"


def test_injection_after_the_run_never_applies_nor_moves_the_clock(healthy: Result) -> None:
    result = run(with_failures(SMALL, "{inject: [{at: 100s, target: {lane: [0, 1]}}]}"))
    assert result.summary["step_time_s"] == healthy.summary["step_time_s"]
    assert result.summary["injections"][0]["applied_s"] is None
    assert result.sim.env.now == pytest.approx(healthy.summary["step_time_s"])


def test_lane_loss_slows_the_step_and_is_deterministic(healthy: Result) -> None:
    text = with_failures(
        SMALL.replace("count: 1}", "count: 1, neuronlink: {lanes: 2}}"),
        "{inject: [{at: 0, target: {lane: [0, 1]}}, {at: 0, target: {lane: [1, 2]}}]}",
    )
    a, b = run(text), run(text)
    assert a.summary["step_time_s"] > healthy.summary["step_time_s"]
    for s in (a.summary, b.summary):
        s.pop("wall_s")
        s.pop("events_per_s")
    assert a.summary == b.summary
    assert a.trace_frame().equals(b.trace_frame())


def test_folding_with_injections() -> None:
    lane = with_failures(SMALL, "{inject: [{target: {lane: [0, 1]}}]}")
    with pytest.raises(ScenarioError) as info:
        run(lane, fidelity="folded")
    assert info.value.path == "--fidelity"
    assert "failures.inject.0" in str(info.value)
    # A chip going down is the same event whichever replica it hits: folding is fine.
    down = run(with_failures(SMALL, "{inject: [{at: 1us, target: {chip: 5}}]}"), fidelity="folded")
    assert down.summary["fidelity"] == "folded"
    assert down.summary["step_failed"]["at_s"] == 1e-6


def test_cut_fabric_is_reported(tmp_path: Path, capsys: Any) -> None:
    # Two instances whose only path to each other is the EFA switch: take it down.
    text = with_failures(
        SMALL.replace("count: 1", "count: 2").replace("size: 8", "size: 16"),
        "{link_detect_delay: 0, inject: [{target: {switch: efa}}]}",
    )
    with pytest.raises(PartitionError, match="cannot reach chip"):
        run(text)
    path = tmp_path / "cut.yaml"
    path.write_text(text)
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot reach chip" in err[0]


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("{chip: 99}", "failures.inject.0.target.chip"),
        ("{link: [0, 5]}", "failures.inject.0.target.link"),
        ("{switch: spine0}", "failures.inject.0.target.switch"),
    ],
)
def test_bad_target_exits_2_naming_the_key(
    tmp_path: Path, capsys: Any, target: str, path: str
) -> None:
    scenario = tmp_path / "bad.yaml"
    scenario.write_text(with_failures(SMALL, f"{{inject: [{{target: {target}}}]}}"))
    for argv in (
        ["run", str(scenario), "--out", str(tmp_path / "o"), "--quiet"],
        ["check", str(scenario)],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"clustersim: error: {path}:")


def test_set_reaches_into_the_list_of_injections() -> None:
    text = with_failures(SMALL, "{inject: [{target: {lane: [0, 1]}}]}")
    res = load_scenario(text, ["failures.inject.0.at=2ms", "failures.inject.0.target.lane.1=3"])
    (inj,) = res.scenario.failures.inject
    assert inj.at == 2e-3 and inj.target.lane == (0, 3)
    with pytest.raises(ScenarioError) as info:
        load_scenario(text, ["failures.inject.1.at=2ms"])
    assert info.value.path == "failures.inject.1"
    assert "a list of 1" in str(info.value)


def test_auto_fidelity_simulates_every_rank_when_an_injection_breaks_symmetry() -> None:
    # 320 ranks: auto folds them, unless a lane's loss makes one replica differ.
    big = SMALL.replace("count: 1", "count: 5").replace("batch_size: 8", "batch_size: 40")
    assert run(big).summary["fidelity"] == "folded"
    lane = run(with_failures(big, "{inject: [{target: {lane: [0, 1]}}]}"))
    assert lane.summary["fidelity"] == "detailed"
    late_chip = run(with_failures(big, "{inject: [{at: 1s, target: {chip: 1}}]}"))
    assert late_chip.summary["fidelity"] == "folded"
    assert late_chip.summary["injections"][0]["applied_s"] is None
