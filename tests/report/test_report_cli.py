"""`clustersim run` writes the report; `clustersim report` rebuilds it and compares runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from clustersim.cli import main
from clustersim.report.figures import FIGURES


def test_run_writes_trace_figures_and_report(tiny_run: Path) -> None:
    names = {p.name for p in tiny_run.iterdir()}
    expected = {"summary.json", "trace.parquet", "trace.json", "report.html"}
    conditional = {"reliability", "engines"}  # failures section; chip_model: engines
    assert expected | {f"{s.name}.png" for s in FIGURES if s.name not in conditional} <= names
    assert not [n for n in names if n.startswith(".")]  # no temporary files left
    # summary.json is written last: it marks a complete result directory.
    written = {p.name: p.stat().st_mtime_ns for p in tiny_run.iterdir()}
    assert written["summary.json"] == max(written.values())
    assert json.loads((tiny_run / "trace.json").read_text())["traceEvents"]


def test_no_report_and_output_html(tmp_path: Path, simulate_tiny: Callable[..., Path]) -> None:
    bare = simulate_tiny(tmp_path, "bare", extra=["--no-report"])
    assert not (bare / "report.html").exists() and not (bare / "trace.json").exists()
    assert (bare / "summary.json").exists()
    no_html = simulate_tiny(tmp_path, "nohtml", "output.html=false")
    assert (no_html / "trace.json").exists()
    assert not (no_html / "report.html").exists()
    assert not list(no_html.glob("*.png"))


def test_report_rebuilds_a_run_directory(
    tiny_run_tp2: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert not (tiny_run_tp2 / "report.html").exists()  # it was run with --no-report
    assert main(["report", str(tiny_run_tp2), "--trace-ranks", "4"]) == 0
    assert "report.html" in capsys.readouterr().out
    assert (tiny_run_tp2 / "report.html").exists() and (tiny_run_tp2 / "timeline.png").exists()
    trace = json.loads((tiny_run_tp2 / "trace.json").read_text())
    assert trace["otherData"]["ranks_shown"].count(",") == 3  # four ranks


def test_report_compares_runs(comparison: Path) -> None:
    assert (comparison / "report.html").exists()
    assert not (comparison / "trace.json").exists()


@pytest.mark.parametrize("kind", ["missing", "empty", "bad_json"])
def test_report_bad_directory_exits_2_with_one_line(
    tmp_path: Path, tiny_run: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    bad = tmp_path / kind
    if kind != "missing":
        bad.mkdir()
    if kind == "bad_json":
        (bad / "summary.json").write_text("{not json")
    assert main(["report", str(bad)]) == 2
    assert main(["report", str(tiny_run), str(bad), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("clustersim: error: ") for line in err)
    assert str(bad) in err[0]
    assert not (tmp_path / "c").exists()  # nothing written when an input is bad
