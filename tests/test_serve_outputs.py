"""The files beside a serving run's summary: the Perfetto trace and the HTML report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from clustersim.cli import main
from clustersim.report.figures import render
from clustersim.report.serving import SERVING_FIGURES, ServeData, ecdf, latency_cdf

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "serve-trn2-llama3-70b-failure.yaml"
# 200 requests over ~100 s: the chip fails at 30 s and the lane at 60 s
SETS = [
    "serving.requests=200", "failures.restart_time=20s",
    "failures.inject.0.at=30s", "failures.inject.1.at=60s",
]  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("serve") / "out"
    args = ["serve", str(SCENARIO), "--out", str(out), "--quiet"]
    for item in SETS:
        args += ["--set", item]
    assert main(args) == 0
    return out


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text("utf-8"))


def test_the_outputs_are_written_whole(run_dir: Path) -> None:
    names = {p.name for p in run_dir.iterdir()}
    assert {"summary.json", "requests.parquet", "iterations.parquet", "trace.json",
            "report.html", "latency_cdf.png", "batch_kv.png"} <= names  # fmt: skip
    assert not [n for n in names if n.startswith(".") or n.endswith(".tmp")]


def test_the_trace_has_a_track_per_replica_and_their_busy_time(run_dir: Path) -> None:
    s = _summary(run_dir)
    doc = json.loads((run_dir / "trace.json").read_text("utf-8"))
    events = doc["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert tracks == {i: f"replica {i}" for i in range(s["replicas"])}
    busy = dict.fromkeys(tracks, 0.0)
    for e in events:
        if e.get("cat") == "iteration":
            busy[e["tid"]] += e["dur"] / 1e6
    assert list(busy.values()) == pytest.approx(s["replica_busy_s"], abs=1e-6)
    steps = sum(e["args"]["steps"] for e in events if e.get("cat") == "iteration")
    assert steps == s["iterations"]
    (down,) = [e for e in events if e.get("cat") == "failure"]
    (chip,) = [f for f in s["failures"]["injections"] if f["target"] == "chip"]
    assert down["tid"] == chip["replicas"][0]
    assert (down["ts"] + down["dur"]) / 1e6 == pytest.approx(chip["back_s"])
    # nothing runs on the failed replica while it is down
    starts = [e["ts"] for e in events if e.get("cat") == "iteration" and e["tid"] == down["tid"]]
    assert not [t for t in starts if down["ts"] <= t < down["ts"] + down["dur"]]


def test_the_cdfs_pass_through_the_summary_percentiles(run_dir: Path) -> None:
    s = _summary(run_dir)
    data = ServeData(s, pd.read_parquet(run_dir / "requests.parquet"))
    fig = latency_cdf(data)
    assert fig is not None
    for ax, key in zip(fig.axes, ("ttft_s", "tpot_s", "e2e_s"), strict=True):
        x, y = ax.lines[0].get_data()
        for q, level in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            assert np.interp(level, y, x) / 1e3 == pytest.approx(s[key][q], rel=1e-9)


def test_ecdf_of_a_small_sample() -> None:
    x, y = ecdf(np.array([3.0, np.nan, 1.0, 2.0]))
    assert list(x) == [1.0, 2.0, 3.0] and list(y) == [0.0, 0.5, 1.0]


def test_the_report_shows_latency_cost_and_failures(run_dir: Path) -> None:
    s = _summary(run_dir)
    page = (run_dir / "report.html").read_text("utf-8")
    assert page.count("data:image/png;base64,") == len(SERVING_FIGURES)
    assert f"{s['ttft_s']['p99'] * 1e3:,.1f} ms" in page
    assert f"${s['usd_per_million_output_tokens']:,.3f}" in page
    assert 'id="failures"' in page and "chip5 down" in page
    assert "<script" not in page


def test_batch_and_kv_figure_needs_the_iterations(run_dir: Path) -> None:
    s = _summary(run_dir)
    requests = pd.read_parquet(run_dir / "requests.parquet")
    iterations = pd.read_parquet(run_dir / "iterations.parquet")
    spec = next(f for f in SERVING_FIGURES if f.name == "batch_kv")
    assert render(spec, ServeData(s, requests)) is None
    drawn = render(spec, ServeData(s, requests, iterations))
    assert drawn is not None and drawn.png.startswith(b"\x89PNG")


def test_output_keys_turn_the_trace_and_report_off(tmp_path: Path) -> None:
    out = tmp_path / "o"
    args = ["serve", str(SCENARIO), "--out", str(out), "--quiet", "--set", "serving.requests=20"]
    assert main([*args, "--set", "output.trace=false", "--set", "output.html=false"]) == 0
    names = {p.name for p in out.iterdir()}
    assert names == {"summary.json", "requests.parquet", "resolved_scenario.yaml"}
