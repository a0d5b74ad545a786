"""Injected failures in the report: trace.json's failures track, the page's section, the
timeline's markers; a run without injections shows none of them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure

from clustersim.cli import main
from clustersim.report import load_run
from clustersim.report.injections import mark_injections, step_of, step_table

INJECT = (
    "failures.inject=[{at: 2ms, target: {lane: [0, 1]}, kind: down},"
    " {at: 4ms, target: {chip: 5}, kind: {straggle: 1.5}},"
    " {at: 100s, target: {chip: 1}, kind: down}]"
)
EXAMPLE = Path(__file__).resolve().parents[2] / "scenarios" / "trn2-ultraserver-lane-loss.yaml"


@pytest.fixture(scope="module")
def injected(simulate_tiny: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two steps of the tiny scenario: a link lost at 2 ms (1 ms to reroute), a straggler
    from 4 ms, and a chip failure after the run that never applies."""
    root = tmp_path_factory.mktemp("injected")
    return simulate_tiny(
        root, "injected", "training.steps=2", "failures.link_detect_delay=1ms", INJECT
    )


def _failure_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e.get("cat") == "failure"]


def _processes(trace: dict[str, Any]) -> set[str]:
    return {
        e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }


def test_trace_shows_each_injection_where_it_applied(injected: Path) -> None:
    summary = json.loads((injected / "summary.json").read_text())
    lane, straggle, late = summary["injections"]
    assert lane["detected_s"] == pytest.approx(0.003) and late["applied_s"] is None
    trace = json.loads((injected / "trace.json").read_text())
    assert "failures" in _processes(trace)
    events = _failure_events(trace)
    instants = {e["args"]["index"]: e for e in events if e["ph"] == "i"}
    assert set(instants) == {0, 1}  # the chip failure at 100 s never applied
    assert instants[0]["name"] == "lane chip0<->chip1 down"
    assert instants[0]["ts"] == pytest.approx(lane["applied_s"] * 1e6)
    assert instants[1]["name"] == "chip5 straggle 1.5"
    assert instants[1]["ts"] == pytest.approx(straggle["applied_s"] * 1e6)
    (stall,) = [e for e in events if e["ph"] == "X"]
    assert stall["ts"] == pytest.approx(2000.0) and stall["dur"] == pytest.approx(1000.0)
    assert trace["otherData"]["injections_not_reached"] == "2"
    # Same clock as the ops: the lane fails while the first step's ops run.
    ops = [e for e in trace["traceEvents"] if e["ph"] == "X" and e.get("cat") != "failure"]
    assert min(e["ts"] for e in ops) < instants[0]["ts"] < max(e["ts"] + e["dur"] for e in ops)
    # `clustersim report DIR` draws the same trace from summary.json.
    before = (injected / "trace.json").read_bytes()
    assert main(["report", str(injected)]) == 0
    assert (injected / "trace.json").read_bytes() == before


def test_report_lists_the_injections(injected: Path) -> None:
    page = (injected / "report.html").read_text()
    assert page.count('<h2 id="injections">Injected failures</h2>') == 1
    section = page.split('id="injections"', 1)[1].split("<h2", 1)[0]
    assert "lane chip0&lt;-&gt;chip1 down" in section  # autoescaped
    assert '<td class="num">2.000 ms</td>' in section
    assert "rerouted at 3 ms" in section and '<td class="num">3.000 ms</td>' in section
    assert "chip5 straggle 1.5" in section and "compute x1.5 from now" in section
    assert "not reached (at 100.000 s, after the run)" in section
    times = json.loads((injected / "summary.json").read_text())["step_times_s"]
    for t in times:
        assert f"{t * 1e3:.3f} ms" in section
    change = f"{times[1] / times[0] - 1:+.1%}"
    assert change in section


def test_timeline_marks_where_injections_applied(injected: Path, tiny_run: Path) -> None:
    summary = load_run(injected, trace=False).summary
    ax = Figure().add_subplot()
    ax.set_xlim(0, 20.0)
    ax.set_ylim(3.5, -0.5)
    handles = [h.get_label() for h in mark_injections(ax, summary, 1e3)]
    assert handles == ["injection", "stall to reroute"]
    xs = sorted({float(line.get_xdata()[0]) for line in ax.lines})
    assert xs == pytest.approx([2.0, 4.0])  # ms: the lane at 2, the straggler at 4
    assert len(ax.patches) == 1  # the stall, 2 to 3 ms
    assert ax.get_ylim()[1] < -0.5  # room above the first row for the labels
    assert [t.get_text().strip() for t in ax.texts] == ["#0", "#1"]
    # A run without injections: nothing drawn, the axes as they were.
    plain = Figure().add_subplot()
    plain.set_ylim(3.5, -0.5)
    assert mark_injections(plain, load_run(tiny_run, trace=False).summary, 1e3) == []
    assert plain.get_ylim() == (3.5, -0.5) and not plain.lines and not plain.texts


def test_no_injections_no_section_no_track(tiny_run: Path) -> None:
    page = (tiny_run / "report.html").read_text()
    assert "Injected failures" not in page and 'id="injections"' not in page
    trace = json.loads((tiny_run / "trace.json").read_text())
    assert "failures" not in _processes(trace) and not _failure_events(trace)
    assert "injections" not in trace["otherData"]


def test_failed_step_writes_the_trace_with_the_failure(
    simulate_tiny: Callable[..., Path], tmp_path: Path
) -> None:
    out = simulate_tiny(tmp_path, "failed", "failures.inject=[{at: 5ms, target: {chip: 3}}]")
    assert not (out / "report.html").exists()  # a report page needs a finished step
    trace = json.loads((out / "trace.json").read_text())
    events = _failure_events(trace)
    (failed,) = [e for e in events if e["name"].startswith("step 0 failed")]
    assert failed["name"] == "step 0 failed: chip3 down" and failed["ts"] == pytest.approx(5000.0)
    (down,) = [e for e in events if e["name"] == "chip3 down"]
    assert down["ts"] == pytest.approx(5000.0) and down["args"]["effect"] == "step failed"
    ops = [e for e in trace["traceEvents"] if e["ph"] == "X" and e.get("cat") != "failure"]
    assert ops and max(e["ts"] + e["dur"] for e in ops) <= 5000.0 + 1e-3


def test_step_table_against_the_steps_before_the_first_injection() -> None:
    assert step_of(0.0, [1.0, 2.0]) == 0
    assert step_of(1.0, [1.0, 2.0]) == 1  # at a boundary: the step that starts
    assert step_of(5.0, [1.0, 2.0]) == 1
    assert step_of(0.5, []) is None
    rec = {
        "index": 0, "at_s": 2.0, "target": "link", "name": "chip0<->chip1", "kind": "down",
        "factor": None, "applied_s": 2.0, "detected_s": 2.01, "effect": "2 links down",
    }  # fmt: skip
    rows = step_table({"step_times_s": [1.0, 1.0, 1.5, 1.2], "injections": [rec]})
    assert [r.injections for r in rows] == [(), (), (0,), ()]
    assert [r.vs_healthy for r in rows] == [None, None, pytest.approx(0.5), pytest.approx(0.2)]
    assert rows[0].vs_previous is None and rows[3].vs_previous == pytest.approx(1.2 / 1.5 - 1)
    assert step_table({"step_times_s": [1.0]}) == []


@pytest.mark.slow
def test_lane_loss_example(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["run", str(EXAMPLE), "--out", str(out), "--quiet"]) == 0
    trace = json.loads((out / "trace.json").read_text())
    events = _failure_events(trace)
    (lane,) = [e for e in events if e["ph"] == "i"]
    assert lane["name"] == "lane chip0<->chip1 down" and lane["ts"] == 0.0
    (stall,) = [e for e in events if e["ph"] == "X"]
    assert (stall["ts"], stall["dur"]) == (0.0, 10_000.0)  # link_detect_delay: 10ms
    page = (out / "report.html").read_text()
    assert "lane chip0&lt;-&gt;chip1 down" in page.split('id="injections"', 1)[1]
