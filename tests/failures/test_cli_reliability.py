"""``clustersim reliability`` and ``run`` with a failures section; bad input exits 2."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest
from scenario_texts import TINY

from clustersim.cli import main

LLAMA3 = Path(__file__).parents[2] / "scenarios" / "llama3-16k-54days.yaml"
FAILURES = "failures: {preset: rsc1, horizon: 7d, spares: 1, seeds: 2}\n"


@pytest.fixture
def tiny_failures(tmp_path: Path) -> Path:
    path = tmp_path / "tiny-failures.yaml"
    path.write_text(TINY + FAILURES)
    return path


def test_llama3_54_days_reproduces_419_interruptions(capsys: pytest.CaptureFixture[str]) -> None:
    """The Llama 3 job with its fleet's rates: 419 unexpected interruptions within 15%."""
    t0 = time.perf_counter()
    args = ["reliability", str(LLAMA3), "--step-time", "6.6s", "--seeds", "4", "--json"]
    assert main([*args, "--workers", "1"]) == 0
    wall = time.perf_counter() - t0
    r = json.loads(capsys.readouterr().out)
    assert r["interruptions"] == pytest.approx(419, rel=0.15)
    assert sum(r["interruptions_by_cause"].values()) == pytest.approx(r["interruptions"])
    assert r["interruptions_by_cause"]["Faulty GPU"] == pytest.approx(148, rel=0.3)
    assert 0.85 < r["ettr"] < r["goodput"] < 1
    assert r["cost"]["usd_per_million_useful_tokens"] > 0
    assert r["ci95"]["goodput"][0] <= r["goodput"] <= r["ci95"]["goodput"][1]
    assert wall < 60  # seconds, not minutes: a few events per failure and checkpoint


def test_reliability_command_with_step_simulation_and_study(
    tiny_failures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rel"
    args = ["reliability", str(tiny_failures), "--seeds", "2", "--workers", "1"]
    assert main([*args, "--checkpoint-study", "--points", "5", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "goodput" in printed and "checkpoint interval study" in printed
    r = json.loads((out / "reliability.json").read_text())
    assert r["step_time_source"] == "simulated" and r["step_time_s"] > 0
    assert len(r["checkpoint_study"]["rows"]) == 5
    timeline = pd.read_parquet(out / "reliability_timeline.parquet")
    assert list(timeline.columns)[:3] == ["seed", "time_s", "class"]


def test_run_adds_reliability_to_the_summary(tiny_failures: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["run", str(tiny_failures), "--out", str(out), "--quiet", "--no-report"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    rel = summary["reliability"]
    assert rel["step_time_s"] == summary["step_time_s"]
    assert rel["seeds"] == 2 and rel["preset"] == "rsc1"
    assert set(rel) >= {
        "goodput", "ettr", "interruptions", "interruptions_by_cause", "lost",
        "time_to_target_s", "cost", "ci95", "checkpoint",
    }  # fmt: skip
    assert (out / "reliability_timeline.parquet").exists()


def test_the_timeline_is_a_chrome_trace(tmp_path: Path) -> None:
    scenario = tmp_path / "tiny-failing.yaml"
    scenario.write_text(TINY + "failures: {preset: rsc1, horizon: 2000d, spares: 1, seeds: 2}\n")
    out = tmp_path / "run"
    assert main(["run", str(scenario), "--out", str(out), "--quiet", "--no-report"]) == 0
    timeline = pd.read_parquet(out / "reliability_timeline.parquet")
    trace = json.loads((out / "reliability_trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] in {"X", "i"}]
    assert len(spans) == len(timeline) > 0
    assert {e["pid"] for e in spans} <= set(timeline["seed"])
    first = min(spans, key=lambda e: (e["pid"], e["ts"]))
    row = timeline.sort_values(["seed", "time_s"]).iloc[0]
    assert first["ts"] == pytest.approx(row["time_s"] * 1e6)
    assert first["name"] == row["cause"]
    if first["ph"] == "X":
        assert first["dur"] == pytest.approx(row["downtime_s"] * 1e6)


def test_run_without_failures_has_no_reliability(tmp_path: Path) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY)
    out = tmp_path / "run"
    assert main(["run", str(scenario), "--out", str(out), "--quiet", "--no-report"]) == 0
    assert "reliability" not in json.loads((out / "summary.json").read_text())
    assert not (out / "reliability_timeline.parquet").exists()


RATES = "failures: {rates: {gpu: %s}}"
BAD = [
    ("failures: {preset: llama4}", [], "failures.preset", "unknown preset"),
    (RATES % "{mtbf: 10d, effect: node}", [], "failures.rates.gpu.per", ""),
    (RATES % "{per: chip, effect: node}", [], "failures.rates.gpu.mtbf", ""),
    (RATES % "{per: gpu, mtbf: 1d, effect: node}", [], "failures.rates.gpu.per", ""),
    (RATES % "{per: chip, mtbf: 1d}", [], "failures.rates.gpu.effect", ""),
    ("failures: {preset: rsc1, spares: -1}", [], "failures.spares", ""),
    ("failures: {preset: rsc1, checkpoint: {interval: often}}", [],
     "failures.checkpoint.interval", ""),
    ("failures: {preset: rsc1, checkpoint: {storage_bandwidth: 0}}", [],
     "failures.checkpoint.storage_bandwidth", ""),
    ("failures: {preset: rsc1, degraded_step_time: 2s, degraded_slowdown: 1.1}", [],
     "failures.degraded_slowdown", "not both"),
    ("failures: {preset: rsc1, chekpoint: {}}", [], "failures.chekpoint", "did you mean"),
    ("failures: {preset: rsc1, rates: {x: {mtbf: 1s, per: chip, effect: job}}, horizon: 1000d}",
     [], "failures.horizon", "failures expected"),
    ("failures: {preset: rsc1}", ["--step-time", "fast"], "--step-time", ""),
    ("failures: {preset: rsc1}", ["--step-time", "0s"], "--step-time", ""),
    ("failures: {preset: rsc1}", ["--seeds", "0"], "--seeds", ""),
    ("", [], "failures.preset", "no failure rates"),
]  # fmt: skip


@pytest.mark.parametrize("case", BAD)
def test_bad_input_names_its_key(
    case: tuple[str, list[str], str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    section, extra, where, phrase = case
    scenario = tmp_path / "bad.yaml"
    scenario.write_text(TINY + section + "\n")
    rc = main(["reliability", str(scenario), "--step-time", "1s", *extra])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1
    assert err.startswith(f"clustersim: error: {where}"), err
    assert phrase in err
    if section and not extra:  # check refuses what reliability refuses
        assert main(["check", str(scenario)]) == 2
        assert capsys.readouterr().err.startswith(f"clustersim: error: {where}")


def test_reliability_figure() -> None:
    from clustersim.failures import evaluate
    from clustersim.report import RunData
    from clustersim.report.reliability import reliability
    from clustersim.scenario import load_scenario

    res = load_scenario(TINY + "failures: {preset: llama3-54d, horizon: 54d}\n")
    rel, _ = evaluate(res, 1.0, 100.0, seeds=2)
    fig = reliability(RunData({"scenario": "tiny", "reliability": rel}))
    assert fig is not None and len(fig.axes) == 2
    assert reliability(RunData({"scenario": "tiny"})) is None


def test_infant_mortality_beyond_the_limit_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Weibull shape far below 1 fails far more often than its MTBF says: refused
    with the key path, from a worker process too."""
    scenario = tmp_path / "infant.yaml"
    rates = "{mtbf: 1.5s, per: chip, effect: job, shape: 0.1}"
    scenario.write_text(TINY + f"failures: {{rates: {{infant: {rates}}}, horizon: 1d}}\n")
    rc = main(["reliability", str(scenario), "--step-time", "1s", "--seeds", "2", "--workers", "2"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("clustersim: error: failures.rates.infant.shape"), err


def test_seeds_change_only_the_stochastic_parts(tmp_path: Path) -> None:
    """The same seed gives a byte-identical summary (apart from the wall-clock keys);
    another seed changes the failure draws and nothing of the simulated step."""

    scenario = tmp_path / "tiny-failing.yaml"  # about 13 failures in the horizon
    scenario.write_text(TINY + "failures: {preset: rsc1, horizon: 2000d, spares: 1, seeds: 2}\n")

    def summary(seed: int, name: str) -> dict[str, object]:
        out = tmp_path / name
        args = ["run", str(scenario), "--out", str(out), "--quiet", "--no-report"]
        assert main([*args, "--seed", str(seed)]) == 0
        data: dict[str, object] = json.loads((out / "summary.json").read_text())
        data.pop("wall_s")
        data.pop("events_per_s")
        return data

    first, again, other = summary(1, "a"), summary(1, "b"), summary(2, "c")
    assert json.dumps(first) == json.dumps(again)
    assert first["reliability"] != other["reliability"]
    for key in ("step_time_s", "breakdown_s", "memory_gib_per_chip", "mfu", "events"):
        assert first[key] == other[key]
