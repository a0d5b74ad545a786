"""Serving workloads: gamma arrivals, trace replay, length distributions, prefix caching."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from clustersim.cli import main
from clustersim.errors import ScenarioError
from clustersim.scenario import load_scenario
from clustersim.serve import arrivals
from clustersim.serve.arrivals import gamma_times, lengths, read_trace
from clustersim.serve.bands import error_bands, shipped_errors
from clustersim.serve.intervals import ERRORS_FILE, errors_yaml, row_errors
from clustersim.serve.run import serve

HEAD = "name: wl\ncluster: {instance: trn2.48xlarge}\nmodel: llama3-8b\nparallelism: {tp: 8}\n"


def scenario(arrival: str, extra: str = "") -> str:
    return f"{HEAD}serving:\n  engine: vllm\n  arrival: {arrival}\n{extra}"


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0])
def test_gamma_gaps_have_the_rate_and_coefficient_of_variation(cv: float) -> None:
    times = np.array(gamma_times(4.0, cv, 200_000, seed=7))
    gaps = np.diff(np.concatenate([[0.0], times]))
    assert gaps.mean() == pytest.approx(1 / 4.0, rel=0.01)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.02)
    assert gamma_times(4.0, cv, 10, seed=7) == gamma_times(4.0, cv, 10, seed=7)


def test_a_gamma_scenario_runs_its_arrivals() -> None:
    res = load_scenario(scenario("{kind: gamma, rate_per_s: 5, cv: 3}", "  requests: 50\n"))
    result = serve(res)
    assert result.summary["requests_finished"] == 50
    expected = gamma_times(5.0, 3.0, 50, res.scenario.seed)
    np.testing.assert_allclose(result.requests["arrival_s"].to_numpy(), expected, rtol=1e-12)


def test_a_trace_replays_its_times_and_lengths(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "timestamp,input_tokens,output_tokens\n10.0,100,5\n10.5,300,7\n10.5,20,1\n12.25,64,3\n",
    )
    res = load_scenario(scenario(f"{{kind: trace, file: {path}}}"))
    frame = serve(res).requests.sort_values("id")
    np.testing.assert_allclose(frame["arrival_s"], [0.0, 0.5, 0.5, 2.25], atol=1e-12)
    assert frame["input_tokens"].tolist() == [100, 300, 20, 64]
    assert frame["output_tokens"].tolist() == [5, 7, 1, 3]
    # serving.requests replays the first rows only
    res = load_scenario(scenario(f"{{kind: trace, file: {path}}}", "  requests: 2\n"))
    assert len(serve(res).requests) == 2


def test_azure_column_names_and_date_times_are_read(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,4808,10\n2023-11-16 18:15:50.9951690,3180,8\n",
    )
    times, inputs, outputs = read_trace(path)
    assert times == pytest.approx([0.0, 4.314579], abs=1e-6)
    assert (inputs, outputs) == ([4808, 3180], [10, 8])


def test_a_relative_trace_is_beside_the_scenario(tmp_path: Path) -> None:
    write(tmp_path, "timestamp,input_tokens,output_tokens\n0,10,2\n1,10,2\n", "t.csv")
    path = tmp_path / "s.yaml"
    path.write_text(scenario("{kind: trace, file: t.csv}"), encoding="utf-8")
    assert serve(load_scenario(path)).summary["requests_finished"] == 2


@pytest.mark.parametrize(
    ("csv", "match"),
    [
        ("timestamp,input_tokens\n0,10\n", "missing column output_tokens"),
        ("timestamp,input_tokens,output_tokens\n0,-5,2\n", "row 2: input_tokens must be"),
        ("timestamp,input_tokens,output_tokens\n0,10,2\n1,,2\n", "row 3: input_tokens must be"),
        ("timestamp,input_tokens,output_tokens\n0,10,NaN\n", "row 2: output_tokens must be"),
        ("timestamp,input_tokens,output_tokens\n0,10.5,2\n", "whole number"),
        ("timestamp,input_tokens,output_tokens\n0,10,2\n5,10,2\n3,10,2\n", "row 4: timestamps"),
        ("timestamp,input_tokens,output_tokens\n0,10,2\nsoon,10,2\n", "row 3: a timestamp"),
        ("timestamp,input_tokens,output_tokens\n", "no rows"),
        ("", "empty"),
    ],
)
def test_bad_traces_name_the_file_and_the_row(tmp_path: Path, csv: str, match: str) -> None:
    path = write(tmp_path, csv)
    with pytest.raises(ScenarioError, match=match) as info:
        read_trace(path)
    assert info.value.path == "serving.arrival.file"


def test_a_trace_over_the_row_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(arrivals, "MAX_TRACE_ROWS", 3)
    path = write(tmp_path, "timestamp,input_tokens,output_tokens\n" + "0,1,1\n" * 4)
    with pytest.raises(ScenarioError, match="more than 3 rows"):
        read_trace(path)


def test_bad_trace_scenarios_exit_2_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "none.csv"
    good = write(tmp_path, "timestamp,input_tokens,output_tokens\n0,10,2\n")
    cases = [
        (scenario(f"{{kind: trace, file: {missing}}}"), "serving.arrival.file"),
        (scenario(f"{{kind: trace, file: {good}}}", "  requests: 5\n"), "serving.requests"),
        (scenario(f"{{kind: trace, file: {good}}}", "  input_tokens: 5\n"), "serving"),
        (scenario("{kind: trace}"), "serving.arrival"),
        (scenario("{kind: gamma, rate_per_s: 2}"), "serving.arrival"),
        (scenario("{kind: gamma, rate_per_s: 0, cv: 1}"), "serving.arrival.rate_per_s"),
        (scenario("{kind: gamma, rate_per_s: .inf, cv: 1}"), "serving.arrival.rate_per_s"),
        (scenario("{kind: gamma, rate_per_s: 1, cv: 0}"), "serving.arrival.cv"),
    ]
    for i, (text, key) in enumerate(cases):
        path = tmp_path / f"s{i}.yaml"
        path.write_text(text, encoding="utf-8")
        out = tmp_path / f"out{i}"
        assert main(["serve", str(path), "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert key in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert not (out / "summary.json").exists()


def test_uniform_and_fixed_lengths() -> None:
    res = load_scenario(
        scenario(
            "{kind: poisson, rate_per_s: 5}",
            "  input_tokens: {kind: uniform, min: 10, max: 20}\n"
            "  output_tokens: {kind: fixed, tokens: 7}\n  requests: 400\n",
        )
    )
    cfg = res.scenario.serving
    assert cfg is not None
    drawn = lengths(cfg.input_tokens, 400, 0, 1)
    assert isinstance(drawn, list) and min(drawn) == 10 and max(drawn) == 20
    assert lengths(cfg.output_tokens, 400, 0, 2) == 7
    frame = serve(res).requests
    assert frame["input_tokens"].between(10, 20).all() and (frame["output_tokens"] == 7).all()
    with pytest.raises(ScenarioError, match="max 5 is below min 10"):
        load_scenario(
            scenario(
                "{kind: poisson, rate_per_s: 5}",
                "  input_tokens: {kind: uniform, min: 10, max: 5}\n",
            )
        )


@pytest.mark.parametrize("engine", ["vllm", "neuron"])
def test_prefix_hits_are_not_prefilled_again(engine: str) -> None:
    """Each request prefills its prompt less the whole blocks the cache holds (at least
    its last token), once; the prompts' KV still counts in full."""
    hit, prompt = 0.5, 1000
    text = scenario("{kind: poisson, rate_per_s: 2}").replace("engine: vllm", f"engine: {engine}")
    extra = f"  requests: 40\n  input_tokens: {prompt}\n  prefix_cache: {{hit_rate: {hit}}}\n"
    result = serve(load_scenario(text + extra), record=True)
    assert result.iterations is not None
    cached = int(hit * prompt) // 16 * 16
    assert result.iterations["prefill_tokens"].sum() == 40 * (prompt - cached)
    assert result.summary["prefix_cache"] == {"hit_rate": hit, "tokens_hit": 40 * cached}
    base = serve(load_scenario(text + extra.replace(f"hit_rate: {hit}", "hit_rate: 0"))).summary
    assert result.summary["ttft_s"]["p50"] < base["ttft_s"]["p50"]
    assert "prefix_cache" not in base


def test_serving_summaries_carry_energy_and_their_familys_uncertainty() -> None:
    res = load_scenario(scenario("{kind: poisson, rate_per_s: 5}", "  requests: 60\n"))
    s = serve(res).summary
    e = s["energy"]
    kw = res.instance.chips * res.chip.power_w / 1000 + res.instance.host_power_w / 1000
    assert e["power_kw"] == pytest.approx(kw, rel=1e-12)
    assert e["kwh"] == pytest.approx(kw * e["pue"] * s["makespan_s"] / 3600, rel=1e-12)
    out_tokens = s["output_tokens_per_s"] * s["makespan_s"]
    assert e["kwh_per_million_output_tokens"] == pytest.approx(e["kwh"] / out_tokens * 1e6)
    bands = error_bands(list(shipped_errors()))
    low, high = bands["trainium"].tpot
    p50 = s["tpot_s"]["p50"]
    assert s["uncertainty"]["tpot_p50_s"] == pytest.approx([p50 / (1 + high), p50 / (1 + low)])
    assert "S1" in s["uncertainty"]["basis"]


def test_the_shipped_serving_errors_are_a_fresh_prediction() -> None:
    """``python -m clustersim.serve.intervals --write`` after any change that moves a row."""
    assert ERRORS_FILE.read_text(encoding="utf-8") == errors_yaml(row_errors())
