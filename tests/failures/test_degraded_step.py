"""continue_degraded without a given degraded step time: derived by simulating the step
with the link-cutting failure's effect injected, and said so in the outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scenario_texts import TINY

from clustersim.cli import main
from clustersim.errors import ScenarioError
from clustersim.scenario import load_scenario
from clustersim.sim import Limits, degraded_step, simulate

# tp 4 inside each chip, dp 16 across the torus: the data-parallel all-reduce crosses links.
BASE = TINY.replace("tp: 4, pp: 2", "tp: 4, pp: 1")
CUTS = """\
failures:
  recovery: continue_degraded
  rates:
    cable: {cause: cable, mtbf: 30d, per: link, effect: link, repair: 4h}
    chip: {cause: chip, mtbf: 300d, per: chip, effect: node, repair: 2d}
"""


def test_run_derives_the_degraded_step_and_says_how() -> None:
    res = load_scenario(BASE + CUTS)
    summary = simulate(res, record=False).summary
    rel = summary["reliability"]
    how = rel["degraded_step"]
    assert how["source"] == "derived"
    assert rel["degraded_step_time_s"] == how["step_time_s"]
    assert how["slowdown"] == pytest.approx(how["step_time_s"] / summary["step_time_s"])
    assert how["slowdown"] > 1.0  # the all-reduce's detour around the cut costs time
    # It is the step with that cable down from the start, routed around at once.
    u, v = how["link"].split("<->")
    cut = BASE + (
        "failures:\n  link_detect_delay: 0s\n"
        f"  inject: [{{at: 0s, target: {{link: [{u}, {v}]}}, kind: down}}]\n"
    )
    assert simulate(load_scenario(cut), record=False).summary["step_time_s"] == how["step_time_s"]
    assert u in how["method"] and "busiest link" in how["method"]


def test_given_or_unneeded_degraded_steps_are_not_derived() -> None:
    given = load_scenario(BASE + CUTS + "  degraded_slowdown: 1.5\n")
    rel = simulate(given, record=False).summary["reliability"]
    assert "degraded_step" not in rel
    assert rel["degraded_step_time_s"] == pytest.approx(1.5 * rel["step_time_s"])
    no_cuts = load_scenario(BASE + "failures: {preset: rsc1, recovery: continue_degraded}\n")
    assert degraded_step(no_cuts) is None  # no class cuts a link: nothing runs degraded
    assert "degraded_step" not in simulate(no_cuts, record=False).summary["reliability"]


def test_a_cut_too_big_to_simulate_in_detail_is_refused_with_a_remedy() -> None:
    # 512 ranks fold; the step with one link cut cannot, and is over the limit.
    big = BASE.replace("count: 1", "count: 8").replace(
        "global_batch_size: 32", "global_batch_size: 128"
    )
    big += CUTS
    with pytest.raises(ScenarioError) as info:
        simulate(load_scenario(big), record=False, limits=Limits(max_events=1000))
    assert info.value.path == "failures.degraded_step_time"
    assert "failures.degraded_slowdown" in str(info.value)


def test_reliability_command_applies_the_derived_slowdown_to_a_given_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "cuts.yaml"
    scenario.write_text(BASE + CUTS)
    argv = ["reliability", str(scenario), "--seeds", "2", "--workers", "1", "--json"]
    assert main([*argv, "--step-time", "2s"]) == 0
    result = json.loads(capsys.readouterr().out)
    how = result["degraded_step"]
    assert result["degraded_step_time_s"] == pytest.approx(2.0 * how["slowdown"])
    assert "--step-time" in how["method"]
    assert main(argv) == 0  # the step simulated: its own degraded step, as run derives it
    measured = json.loads(capsys.readouterr().out)
    assert measured["degraded_step"]["source"] == "derived"
    assert measured["degraded_step_time_s"] == measured["degraded_step"]["step_time_s"]
    assert main(["check", str(scenario)]) == 0  # no longer an error: it can be derived
