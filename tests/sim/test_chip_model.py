"""``chip_model`` (``--chip-model``): both models run, and bad input exits 2 with its key."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from clustersim.cli import main
from clustersim.cli_args import build_parser
from clustersim.trace.engines import ENGINE_COLUMNS

ENGINE_KEYS = {"tensor", "vector", "scalar", "gpsimd", "dma", "hbm"}


def _run(tiny_yaml: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    out = tmp_path / "out"
    args = ["run", str(tiny_yaml), "--out", str(out), "--json", "--no-report", "--force", *extra]
    assert main(args) == 0
    summary: dict = json.loads(capsys.readouterr().out)
    return summary


def test_both_chip_models_run_and_say_which(
    tiny_yaml: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    roof = _run(tiny_yaml, tmp_path, capsys)
    assert roof["chip_model"] == "roofline"
    assert "engine_busy" not in roof
    eng = _run(tiny_yaml, tmp_path, capsys, "--chip-model", "engines")
    assert eng["chip_model"] == "engines"
    assert set(eng["engine_busy"]) == ENGINE_KEYS
    assert all(0 <= v <= 1 for v in eng["engine_busy"].values())
    assert eng["engine_busy"]["tensor"] > 0
    assert sum(eng["breakdown_s"].values()) == pytest.approx(eng["step_time_s"], rel=1e-9)
    # The same layout and traffic; only compute differs, and not by much.
    assert eng["step_time_s"] == pytest.approx(roof["step_time_s"], rel=0.25)
    again = _run(tiny_yaml, tmp_path, capsys, "--set", "chip_model=engines")
    assert again["step_time_s"] == eng["step_time_s"]  # deterministic, flag = key
    assert again["engine_busy"] == eng["engine_busy"]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--set", "chip_model=systolic"], "chip_model"),
        (["--set", "cluster.instance=p6-b200.48xlarge", "--chip-model", "engines"], "chip_model"),
    ],
    ids=["unknown-model", "no-engine-description"],
)
def test_bad_chip_model_exits_2_naming_the_key(
    tiny_yaml: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    needle: str,
) -> None:
    args = ["run", str(tiny_yaml), "--out", str(tmp_path / "o"), "--no-report", *extra]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"clustersim: error: {needle}:")
    assert len(err.splitlines()) == 1


def test_collective_takes_the_chip_model(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["collective", "--instance", "trn2.48xlarge", "--size", "1MiB", "--json"]
    assert main([*base, "--chip-model", "engines"]) == 0
    engines = json.loads(capsys.readouterr().out)
    assert main(base) == 0
    assert engines == json.loads(capsys.readouterr().out)  # no compute to meet
    b200 = ["collective", "--instance", "p6-b200.48xlarge", "--size", "1MiB"]
    assert main([*b200, "--chip-model", "engines"]) == 2
    assert "chip_model" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "sweep", "search", "collective"])
def test_every_simulating_command_has_the_flag(command: str) -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    options = {o for a in sub.choices[command]._actions for o in a.option_strings}  # type: ignore[attr-defined]
    assert "--chip-model" in options


def test_engine_model_outputs_tracks_and_figure(tiny_yaml: Path, tmp_path: Path) -> None:
    out = tmp_path / "eng"
    assert (
        main(["run", str(tiny_yaml), "--out", str(out), "--quiet", "--chip-model", "engines"]) == 0
    )
    engines = pd.read_parquet(out / "engines.parquet")
    assert set(engines.columns) == set(ENGINE_COLUMNS)
    assert (engines["end_s"] >= engines["start_s"]).all()
    assert (engines["busy_s"] <= engines["end_s"] - engines["start_s"] + 1e-12).all()
    trace = json.loads((out / "trace.json").read_text())
    threads = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert {f"rank 0 core 0: {e} tiles" for e in ("tensor", "vector", "dma")} <= threads
    chunks = [e for e in trace["traceEvents"] if e.get("cat") == "engine"]
    assert len(chunks) == trace["otherData"]["engine_chunks_shown"] > 0
    assert (out / "engines.png").is_file()
    assert "Engine utilisation" in (out / "report.html").read_text()
    (out / "engines.png").unlink()
    assert main(["report", str(out)]) == 0  # rebuilt from the directory
    assert (out / "engines.png").is_file()
