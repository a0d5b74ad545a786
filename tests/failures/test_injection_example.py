"""The lane-loss example of docs/tutorials/failure-study.md: one NeuronLink lane lost
in a Trn2 UltraServer."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.scenario import load_scenario
from clustersim.sim import simulate

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "trn2-ultraserver-lane-loss.yaml"


def steps(*sets: str) -> list[float]:
    summary = simulate(load_scenario(SCENARIO, list(sets))).summary
    # step_times_s comes with injections; without, every step takes step_time_s.
    times: list[float] = summary.get("step_times_s", [summary["step_time_s"]] * 2)
    return times


@pytest.mark.slow
def test_lane_loss_with_one_and_two_lanes() -> None:
    healthy = steps("failures.inject=[]")
    assert healthy == steps("failures.inject=[]", "cluster.neuronlink.lanes=2")
    one = steps()
    two = steps("cluster.neuronlink.lanes=2")
    at_once = steps("failures.link_detect_delay=0")
    # One lane per link: the link is lost. The first step also waits for detection
    # (at most the 10 ms delay); later steps run on the detour, as if it were instant.
    assert one[1] == pytest.approx(at_once[0], rel=1e-9) == pytest.approx(at_once[1], rel=1e-9)
    assert one[1] < one[0] <= one[1] + 10e-3
    assert one[1] > healthy[1]
    # Two lanes: half the link for every step, no reroute; it costs more here.
    assert two[0] == pytest.approx(two[1], rel=1e-9)
    assert two[1] > one[1] > healthy[1]
