"""``clustersim serve-search``: the pick meets the SLO and nothing cheaper that was
simulated does; bad input exits 2 with nothing written; the outputs are written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from clustersim.cli import main
from clustersim.report.serve_search import pareto_front
from clustersim.scenario import load_scenario, resolve
from clustersim.serve.capacity import CapacityResult, serve_search
from clustersim.serve.capacity_layouts import Layout, estimate, scenario_of
from clustersim.serve.intervals import ErrorBand, RowError, error_bands
from clustersim.serve.run import serve

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "serve-inf2-llama3-8b.yaml"
INSTANCES = ("inf2.xlarge", "inf2.8xlarge", "p5.48xlarge")
RATE = 4.0


@pytest.fixture(scope="module")
def result() -> CapacityResult:
    """Llama-3-8B at 4 requests/s over a small and a large Inferentia2 and an H100 box."""
    return serve_search(load_scenario(SCENARIO), RATE, instances=INSTANCES, requests=60)


def test_the_pick_meets_the_slo_and_nothing_cheaper_simulated_does(
    result: CapacityResult,
) -> None:
    pick = result.pick
    assert pick is not None
    slo = result.meta["slo"]
    assert pick["meets_slo"]
    assert pick["ttft_p90_s"] <= slo["ttft_s"]
    assert pick["tpot_p90_s"] <= slo["tpot_s"]
    # The pick ran again with the scenario's own requests (240), not the 60 per candidate.
    assert pick["requests"] == load_scenario(SCENARIO).scenario.serving.requests  # type: ignore[union-attr]
    frame = result.frame
    simulated = frame[frame["status"].isin(["pick", "meets", "misses"])]
    cheaper = simulated[simulated["usd_per_hour"] < pick["usd_per_hour"]]
    assert not cheaper["meets_slo"].any()
    met = simulated[simulated["meets_slo"]]
    assert met["usd_per_million_output_tokens"].min() == pytest.approx(
        pick["usd_per_million_output_tokens"]
    )
    # $ per million output tokens at the offered rate: price / (rate x output tokens).
    expected = pick["usd_per_hour"] / 3600 / (RATE * 512) * 1e6
    assert pick["usd_per_million_output_tokens"] == pytest.approx(expected)


def test_the_pick_is_what_clustersim_serve_gives_for_its_scenario(
    result: CapacityResult,
) -> None:
    pick = result.pick
    assert pick is not None
    base = load_scenario(SCENARIO)
    lay = Layout(pick["instance"], pick["tp"], pick["engine"], pick["max_num_seqs"], 128)
    summary = serve(resolve(scenario_of(base, lay, pick["instances"], RATE, 240))).summary
    assert summary["ttft_s"]["p90"] == pytest.approx(pick["ttft_p90_s"])
    assert summary["tpot_s"]["p90"] == pytest.approx(pick["tpot_p90_s"])
    assert summary["replicas"] == pick["replicas"]


def test_layouts_that_cannot_serve_are_refused_with_a_reason() -> None:
    base = load_scenario(SCENARIO, ["model=llama3-70b", "serving.slo.tpot_s=0.001"])
    # Llama-3-70B does not fit one Inferentia2 chip at any TP.
    est, why = estimate(base, Layout("inf2.xlarge", 2, "neuron", 8, 128), RATE, 60)
    assert est is None and why.startswith("model: does not fit a rank")
    # On 24 cores it fits, but no decode step takes 1 ms.
    est, why = estimate(base, Layout("inf2.48xlarge", 24, "neuron", 8, 128), RATE, 60)
    assert est is None and why.startswith("batch-1 decode step")
    est, why = estimate(base, Layout("inf2.48xlarge", 3, "neuron", 8, 128), RATE, 60)
    assert est is None and why.startswith("parallelism.tp:")


def test_nothing_meets_an_impossible_slo() -> None:
    res = load_scenario(SCENARIO, ["serving.slo.ttft_s=0.001"])
    result = serve_search(res, RATE, instances=("inf2.xlarge",), requests=30)
    assert result.pick is None
    assert set(result.frame["status"]) == {"skipped"}


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--rate", "0"], "--rate"),
        (["--rate", "inf"], "--rate"),
        (["--rate", "-2"], "--rate"),
        (["--rate", "nan"], "--rate"),
        (["--rate", "fast"], "--rate"),
        (["--rate", "4", "--instance", "trn9.huge"], "--instance"),
        (["--rate", "4", "--set", "serving.slo.tpot_s=0"], "serving.slo.tpot_s"),
    ],
)
def test_bad_input_exits_2_naming_the_flag(
    argv: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["serve-search", str(SCENARIO), *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"clustersim: error: {flag}") and "\n" not in err
    assert not out.exists()


def test_a_training_scenario_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = ROOT / "scenarios" / "trn2-llama3-8b.yaml"
    out = tmp_path / "out"
    assert main(["serve-search", str(scenario), "--rate", "4", "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith("clustersim: error: serving:")
    assert not out.exists()


def test_outputs_are_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "search"
    argv = ["serve-search", str(SCENARIO), "--rate", "2", "--instance", "inf2.xlarge"]
    assert main([*argv, "--requests", "40", "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    names = {"serve_search.parquet", "serve_search.csv", "serve_search.json", "pareto.png"}
    assert {p.name for p in out.iterdir()} == names
    meta = json.loads((out / "serve_search.json").read_text())
    assert meta["pick"]["instance"] == "inf2.xlarge"
    assert printed["pick"] == meta["pick"]
    frame = pd.read_parquet(out / "serve_search.parquet")
    assert len(frame) == len(pd.read_csv(out / "serve_search.csv"))
    assert (frame["status"] == "pick").sum() == 1
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_pareto_front_is_the_undominated_points() -> None:
    latency = np.array([1.0, 2.0, 3.0, 1.5, 4.0, 2.0])
    throughput = np.array([10.0, 30.0, 20.0, 5.0, 40.0, 25.0])
    # 1.5 s (5) is beaten by 1 s (10); 3 s (20) and the second 2 s (25) by 2 s (30).
    assert pareto_front(latency, throughput).tolist() == [0, 1, 4]


def test_error_bands_span_each_familys_rows() -> None:
    errors = [
        RowError("A", "trainium", 0.1, 0.5),
        RowError("B", "trainium", -0.2, 0.0),
        RowError("C", "gpu", -0.1, 0.05),
    ]
    bands = error_bands(errors)
    assert bands["trainium"] == ErrorBand("trainium", ("A", "B"), (-0.2, 0.1), (0.0, 0.5))
    # A 30 ms prediction, if the model erred as these rows did: 30 / 1.5 to 30 / 1.0.
    low, high = bands["trainium"].interval("tpot", 0.030)
    assert (low, high) == pytest.approx((0.020, 0.030))
    # Every GPU row's TTFT came out 10% short: the measurement would be above.
    assert bands["gpu"].interval("ttft", 0.090) == pytest.approx((0.1, 0.1))


def test_the_help_names_the_default_instances() -> None:
    from clustersim.cli_args import build_parser
    from clustersim.serve.capacity import DEFAULT_INSTANCES

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    text = " ".join(sub.choices["serve-search"].format_help().split())  # type: ignore[attr-defined]
    assert "default: " + ", ".join(DEFAULT_INSTANCES) in text
