"""``clustersim run`` on a trace workload writes the report a built run gets: report.html,
its figures and trace.json; ``clustersim report`` rebuilds it and compares it with a
built run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from clustersim.cli import main
from clustersim.report import load_run, utilisation
from tests.chakra_et.helpers import coll, comp, ring_scenario, write_traces

MiB = 2**20
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trace_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four ranks computing around two all-reduces (process groups "0" and "7")."""
    tmp = tmp_path_factory.mktemp("trace-run")
    even = [comp(0, 30), coll(1, 0, MiB, (0,)), comp(2, 20, (1,)), coll(3, 0, MiB, (2,), pg="7")]
    odd = [comp(0, 30), coll(1, 0, MiB, (0,)), comp(2, 40, (1,))]
    prefix = write_traces(tmp / "traces", [even, odd, even, odd])
    (tmp / "traces" / "comm_group.json").write_text('{"7": [0, 2]}')
    data = ring_scenario(4, prefix)
    data["output"] = {"trace": True, "html": True}
    scenario = tmp / "ring4-trace.yaml"
    scenario.write_text(yaml.safe_dump(data))
    out = tmp / "out"
    assert main(["run", str(scenario), "--out", str(out), "--quiet"]) == 0
    return out


def test_a_trace_run_writes_the_report(trace_run: Path) -> None:
    names = {p.name for p in trace_run.iterdir()}
    assert {"report.html", "trace.json", "timeline.png", "utilisation.png", "breakdown.png",
            "cost.png", "summary.json", "trace.parquet"} <= names  # fmt: skip
    assert "memory.png" not in names  # no memory model for a trace
    page = (trace_run / "report.html").read_text()
    assert "Chakra traces" in page and "4 files, compute replay" in page
    assert "$ per step" in page and "nodes per step" in page
    assert '<div class="k">MFU</div>' not in page  # a trace has no model FLOPs
    events = json.loads((trace_run / "trace.json").read_text())["traceEvents"]
    assert {e["name"] for e in events if e.get("ph") == "X"} >= {"comp0", "coll1", "comp2"}


def test_utilisation_columns_of_a_trace(trace_run: Path) -> None:
    """Compute, and one column per collective operation (the process groups are many and
    numbered); ranks 1 and 3 compute 70 us of the step, ranks 0 and 2 50 us."""
    data = load_run(trace_run)
    matrix, unit = utilisation(data)
    assert unit == "rank" and list(matrix.columns) == ["compute", "all-reduce comm"]
    step = data.step_time_s
    assert matrix.loc[1, "compute"] == pytest.approx(70e-6 / step)
    assert matrix.loc[0, "compute"] == pytest.approx(50e-6 / step)


def test_report_rebuilds_and_compares_with_a_built_run(trace_run: Path, tmp_path: Path) -> None:
    assert main(["report", str(trace_run), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "report.html").is_file()
    built = tmp_path / "built"
    scenario = ROOT / "scenarios" / "p5-llama3-8b.yaml"
    args = ["run", str(scenario), "--out", str(built), "--quiet", "--set", "model.layers=1",
            "--set", "output.trace=false"]  # fmt: skip
    assert main(args) == 0
    assert main(["report", str(trace_run), str(built), "--out", str(tmp_path / "cmp")]) == 0
    assert (tmp_path / "cmp" / "compare_cost.png").is_file()
    assert not (tmp_path / "cmp" / "compare_efficiency.png").exists()  # no tokens in a trace
