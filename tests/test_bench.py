"""The bench: cases run in child processes, failures and timeouts are reported, not raised."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from rich.console import Console

from clustersim.bench import (
    CASES,
    QUICK,
    bench_tables,
    evaluate_targets,
    fold_scenario,
    run_case,
    select_cases,
)
from clustersim.bench.cases import run_simpy
from clustersim.bench.summary import event_rate, scaling
from clustersim.cli import main
from clustersim.errors import ScenarioError
from clustersim.scenario import load_scenario

GIB = 2**30
MACHINE = {
    "cpu": "test CPU", "cores": 2, "cores_usable": 2, "load_average": [0.5, 0.4, 0.3],
    "memory_bytes": 8 * GIB, "python": "3.11", "implementation": "CPython",
    "platform": "Linux", "simpy": "4.1", "numpy": "2", "clustersim": "0.1",
}  # fmt: skip


def _case(name: str, status: str = "ok", wall: float = 1.0, **figures: Any) -> dict[str, Any]:
    return {
        "name": name,
        "status": status,
        "wall_s": wall,
        "process_s": wall,
        "peak_rss_bytes": 100 * 2**20,
        "ru_maxrss_bytes": None,
        "error": None if status == "ok" else "did not finish in 120 s",
        "phase": None if status == "ok" else "planning, building the topology",
        "figures": figures,
    }


def test_bare_simpy_rate_is_positive() -> None:
    phases: list[str] = []
    fig = run_simpy(phases.append, processes=10, timeouts=100)
    assert fig["events"] == 1000
    assert fig["events_per_s"] > 0
    # SimPy also schedules each process's start and end.
    assert fig["simpy_events"] is not None
    assert fig["simpy_events"] >= 1000
    assert phases


def test_quick_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--json", "--quick", "--only", "simpy", "collective"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"machine", "settings", "cases", "event_rate", "scaling", "targets"}
    assert set(out["machine"]) >= {"cpu", "cores", "memory_bytes", "python"}
    assert list(out["cases"]) == ["simpy", "collective"]
    for case in out["cases"].values():
        assert case["status"] == "ok", case
        assert case["wall_s"] > 0
        assert case["process_s"] >= case["wall_s"]
        assert case["peak_rss_bytes"] > 0
    assert out["cases"]["simpy"]["figures"]["events_per_s"] > 0
    coll = out["cases"]["collective"]["figures"]
    assert coll["ranks"] == 1024
    assert coll["algorithm"] == "ring"
    assert out["event_rate"]["bare_simpy_events_per_s"] > 0
    assert out["event_rate"]["ratio"] is None  # no detailed run
    assert out["scaling"] == []
    status = {t["key"]: t["status"] for t in out["targets"]}
    assert status["collective_wall"] in ("met", "missed")
    assert status["event_rate_ratio"] == "not run"
    assert status["fold_1m_wall"] == "not run"


def test_timeout_is_reported_not_raised() -> None:
    case = run_case("simpy", timeout_s=0.05)
    assert case["status"] == "timeout"
    assert "did not finish in 0.05 s" in case["error"]
    assert case["figures"] == {}


def test_stopped_case_says_where_it_was() -> None:
    case = run_case("ultraserver", timeout_s=4)  # about 9 s of work: surely mid-run at 4 s
    assert case["status"] == "timeout", case  # the whole case, if this ever fails under load
    assert case["phase"], case
    assert case["stack"], f"the child should dump its stack on SIGUSR1: {case}"
    assert "clustersim/" in (case["where"] or ""), case


def test_failure_is_reported_not_raised() -> None:
    case = run_case("no-such-case", timeout_s=30)
    assert case["status"] == "failed"
    assert "unknown case 'no-such-case'" in case["error"]
    assert case["peak_rss_bytes"] > 0


def test_unstartable_child_is_reported() -> None:
    case = run_case("simpy", python="/nonexistent/python")
    assert case["status"] == "failed"
    assert "could not start" in case["error"]


def test_memory_cap_stops_a_case() -> None:
    case = run_case("simpy", timeout_s=30, max_rss_bytes=1)
    assert case["status"] == "memory"
    assert "resident memory over" in case["error"]


def test_select_cases() -> None:
    assert select_cases() == list(CASES)
    assert select_cases(quick=True) == list(QUICK)
    assert select_cases(["collective", "simpy"]) == ["simpy", "collective"]
    assert select_cases(["scaling"], quick=True) == ["fold-1k", "fold-4k"]
    assert select_cases(["fold-1m"], quick=True) == ["fold-1m"]  # named: runs anyway
    with pytest.raises(ScenarioError, match="unknown case"):
        select_cases(["nope"])


def test_cli_refuses_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--only", "nope"]) == 2
    assert "--only" in capsys.readouterr().err
    assert main(["bench", "--timeout", "0", "--only", "simpy"]) == 2
    assert main(["bench", "--max-rss", "lots", "--only", "simpy"]) == 2


@pytest.mark.parametrize(("chips", "dp", "batch"), [(1024, 32, 128), (16_384, 512, 2048)])
def test_fold_scenario(chips: int, dp: int, batch: int) -> None:
    res = load_scenario(fold_scenario(chips))
    assert res.chips == chips
    assert res.ranks // (8 * 16) == dp
    assert res.scenario.training.global_batch_size == batch
    assert res.scenario.parallelism.uneven_stages
    assert not res.scenario.output.trace


def test_targets_from_results() -> None:
    cases = {
        "simpy": _case("simpy", events_per_s=1e6, simpy_events=1e6, loop_wall_s=1.0),
        "ultraserver": _case(
            "ultraserver", wall=20.0, events_per_s=6e5, simpy_events_per_s=8e5, step_time_s=11.0
        ),
        "collective": _case("collective", wall=1.5),
        "fold-16k": _case("fold-16k", wall=8.0, step_time_s=38.0),
        "fold-1m": _case("fold-1m", status="timeout", wall=120.0),
    }
    cases["fold-1m"]["peak_rss_bytes"] = 5 * GIB
    rate = event_rate(cases)
    assert rate["ratio"] == pytest.approx(0.6)
    assert rate["simpy_level_ratio"] == pytest.approx(0.8)
    by_key = {t["key"]: t for t in evaluate_targets(cases)}
    assert by_key["event_rate_ratio"]["status"] == "met"
    assert by_key["ultraserver_wall"]["status"] == "met"
    assert by_key["fold_16k_wall"]["status"] == "met"
    assert by_key["collective_wall"]["status"] == "missed"
    assert by_key["fold_1m_wall"]["status"] == "missed"
    assert "did not finish" in by_key["fold_1m_wall"]["note"]
    assert by_key["fold_1m_rss"]["status"] == "missed"
    assert by_key["fold_1m_rss"]["figure"] == "5.00 GiB when stopped"
    assert by_key["sublinear"]["status"] == "missed"
    assert by_key["sublinear"]["figure"] == "> 15.0x"
    rows = scaling(cases)
    assert [r["chips"] for r in rows] == [16_384, 1_048_576]
    assert rows[1]["vs_previous"] is None  # a stopped run has no ratio

    cases["fold-1m"] = _case("fold-1m", wall=40.0)
    by_key = {t["key"]: t for t in evaluate_targets(cases)}
    assert by_key["fold_1m_wall"]["status"] == "met"
    assert by_key["fold_1m_rss"]["status"] == "met"
    assert by_key["sublinear"]["status"] == "met"
    assert by_key["sublinear"]["value"] == pytest.approx(5.0)

    only = {t["key"]: t["status"] for t in evaluate_targets({"simpy": cases["simpy"]})}
    assert set(only.values()) == {"not run"}


def test_tables_render() -> None:
    cases = {
        "simpy": _case("simpy", events=10, events_per_s=1e6, simpy_events=12, loop_wall_s=1.0),
        "fold-1k": _case("fold-1k", step_time_s=38.0),
        "fold-1m": _case("fold-1m", status="timeout", wall=120.0),
    }
    result = {
        "machine": MACHINE,
        "cases": cases,
        "event_rate": event_rate(cases),
        "scaling": scaling(cases),
        "targets": evaluate_targets(cases),
    }
    buf = io.StringIO()
    con = Console(file=buf, width=160)
    for table in bench_tables(result):
        con.print(table)
    text = buf.getvalue()
    assert "test CPU" in text
    assert "did not finish in 120 s" in text
    assert "stopped while planning" in text
    assert "not run" in text


@pytest.mark.benchmark
def test_ultraserver_detailed_case() -> None:
    case = run_case("ultraserver", timeout_s=300)
    assert case["status"] == "ok", case
    fig = case["figures"]
    assert fig["fidelity"] == "detailed"
    assert fig["events"] > 0
    assert fig["simpy_events"] > 0


def test_stack_dump_is_parsed() -> None:
    from clustersim.bench.runner import PHASE_MARKER, _phase, _stack, _where

    stderr = (
        f"{PHASE_MARKER}planning, building the topology\n"
        "Current thread 0x00007f00 (most recent call first):\n"
        '  File "/venv/lib/python3.11/site-packages/numpy/lib/x.py", line 3 in _unique1d\n'
        '  File "/src/clustersim/network/maxmin.py", line 155 in _fill\n'
        '  File "/src/clustersim/sim/engine.py", line 345 in run\n'
        '  File "/src/clustersim/bench/cases.py", line 9 in _simulate\n'
        "\n"
    )
    stack = _stack(stderr)
    assert stack[0] == "_unique1d (numpy/lib/x.py:3)"
    assert len(stack) == 4
    assert _where(stack) == (
        "_unique1d (numpy/lib/x.py:3) < _fill (clustersim/network/maxmin.py:155) "
        "< run (clustersim/sim/engine.py:345)"
    )
    assert _phase(stderr, stack) == "simulating, before the first progress report"
    assert _phase(stderr, []) == "planning, building the topology"


@pytest.mark.parametrize(("name", "chips"), [("moe-16k", 16_384), ("moe-128k", 131_072)])
def test_moe_cases_are_the_deepseek_example_at_their_size(name: str, chips: int) -> None:
    from clustersim.bench.cases import MOE_CHIPS, MOE_SCENARIO, scenario_path

    assert MOE_CHIPS[name] == chips
    count = f"cluster.count={chips // 16}"
    res = load_scenario(scenario_path(MOE_SCENARIO), [count])
    assert res.chips == chips and res.scenario.model == "deepseek-v3"
    assert res.scenario.training.global_batch_size == 15360


def test_all_to_all_targets() -> None:
    cases = {"a2a-256": _case("a2a-256", wall=0.4), "a2a-4k": _case("a2a-4k", wall=12.0)}
    by_key = {t["key"]: t for t in evaluate_targets(cases)}
    assert by_key["a2a_256_wall"]["status"] == "met"
    assert by_key["a2a_4k_wall"]["status"] == "missed"
    assert by_key["moe_16k_wall"]["status"] == "not run"
    assert select_cases(["all-to-all"], quick=True) == ["a2a-256"]
    assert select_cases(["moe"]) == ["moe-16k", "moe-128k"]


def test_serving_cases_are_the_issue_workloads() -> None:
    from clustersim.bench.cases import SERVE_CASES, serve_scenario

    one = load_scenario(serve_scenario("serve-trn2"))
    assert one.scenario.serving is not None
    assert (one.instance.name, one.scenario.cluster.count) == ("trn2.48xlarge", 1)
    assert one.scenario.serving.requests == 10_000
    assert one.scenario.serving.arrival.rate_per_s == 10
    assert one.ranks // one.scenario.parallelism.tp == 8
    us = load_scenario(serve_scenario("serve-ultraserver"))
    assert us.scenario.serving is not None
    hour = us.scenario.serving.requests / (us.scenario.serving.arrival.rate_per_s or 0)
    assert hour == 3600 and us.chips == 64
    assert select_cases(["serving"]) == [*SERVE_CASES, "serve-search"]
    cases = {"serve-trn2": _case("serve-trn2", wall=3.0), "serve-ultraserver": _case(
        "serve-ultraserver", wall=75.0)}  # fmt: skip
    by_key = {t["key"]: t for t in evaluate_targets(cases)}
    assert by_key["serve_trn2_wall"]["status"] == "met"
    assert by_key["serve_ultraserver_wall"]["status"] == "missed"


def test_dense_traffic_targets_judge_the_whole_process() -> None:
    switch = {**_case("a2a-1024-switch", wall=0.6), "process_s": 1.4}
    ring = {**_case("a2a-1024-ring", wall=30.0), "process_s": 31.0}
    ring["peak_rss_bytes"] = 5 * 2**30
    fat = {**_case("fattree-1m", wall=19.0), "peak_rss_bytes": 2**30}
    cases = {"a2a-1024-switch": switch, "a2a-1024-ring": ring, "fattree-1m": fat}
    by_key = {t["key"]: t for t in evaluate_targets(cases)}
    assert by_key["a2a_1024_switch_process"]["status"] == "missed"  # 1.4 s with the imports
    assert by_key["a2a_1024_ring_process"]["status"] == "met"
    assert by_key["a2a_1024_ring_rss"]["status"] == "missed"
    assert by_key["fattree_1m_wall"]["status"] == "met"
    assert by_key["fattree_1m_rss"]["status"] == "met"
    assert select_cases(["dense-traffic"]) == [
        "a2a-1024-switch", "a2a-1024-ring", "fattree-1m", "moe-128k",
    ]  # fmt: skip


@pytest.mark.slow
def test_dense_all_to_all_case_runs() -> None:
    fig = CASES["a2a-1024-switch"].run(lambda text: None)
    assert fig["ranks"] == 1024 and fig["algorithm"] == "mesh"
    assert fig["collective_time_s"] == pytest.approx(0.00247173356, rel=1e-9)


def test_chakra_cases_target_and_tables() -> None:
    """The load target reads the load alone, not the case's wall (which writes the trace)."""
    load = _case("chakra-load", wall=30.0, nodes=200_000, file_bytes=9_000_000,
                 load_wall_s=4.0, load_cpu_s=3.5, nodes_per_s=5e4)  # fmt: skip
    rt = _case("chakra-8b", wall=60.0, scenario="s", ranks=64, nodes=10, trace_bytes=100,
               export_wall_s=1.0, built_wall_s=1.0, import_wall_s=2.0, events=5,
               events_per_s=2.5, step_time_s=1.0, built_step_time_s=1.0,
               round_trip_error=1e-5)  # fmt: skip
    cases = {"chakra-load": load, "chakra-8b": rt}
    by_key = {t["key"]: t for t in evaluate_targets(cases)}
    assert by_key["chakra_load_wall"]["status"] == "met"
    assert by_key["chakra_load_wall"]["value"] == 4.0
    assert select_cases(["chakra"]) == ["chakra-load", "chakra-8b"]
    result = {"machine": MACHINE, "cases": cases, "event_rate": event_rate(cases),
              "scaling": scaling(cases), "targets": evaluate_targets(cases)}  # fmt: skip
    buf = io.StringIO()
    for table in bench_tables(result):
        Console(file=buf, width=160).print(table)
    assert "+0.0010%" in buf.getvalue() and "200,000 nodes" in buf.getvalue()


def test_chakra_load_trace_is_one_chain() -> None:
    from clustersim.bench.chakra import chain_trace
    from clustersim.chakra import decode_file

    et = decode_file(chain_trace(300), "t.0.et")
    assert len(et.nodes) == 300 and et.nodes[99].type == 7 and et.nodes[5].data_deps == [4]
