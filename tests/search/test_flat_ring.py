"""The estimate's flat ring on torus groups that are no grid, against the simulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.hardware.chip import ChipModel
from clustersim.scenario import load_scenario
from clustersim.search.estimate import Estimator, NetModel
from clustersim.search.flatring import flat_ring
from clustersim.sim import simulate

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
LANE_LOSS = SCENARIOS / "trn2-ultraserver-lane-loss.yaml"


def _net(path: Path) -> NetModel:
    res = load_scenario(path, ["failures={}", "training.steps=1"])
    return NetModel.of(res.instance, res.chip, res.scenario.cluster.count, res.lnc)


def test_every_other_chip_pair_is_a_flat_ring_with_its_busiest_link() -> None:
    # TP 8 at 4 ranks per chip: each DP group holds one chip of every pair along the
    # snake, (0,0) (2,0) (3,1) (1,1) ... on each plane: no grid. The 8 groups' rings
    # put 8 pairs on the busiest x link (one direction; 12 when every pair half way
    # round went the positive way, before ties split by parity), and the longest route is
    # x, y and z (1.5 + 1.5 + 2 us).
    net = _net(LANE_LOSS)
    assert net.torus is not None
    ring = flat_ring(net.torus, 8, 32)
    assert ring is not None and ring.p == 32
    assert ring.s_per_byte == pytest.approx(8 / net.fabric_Bps)
    assert ring.route_s == pytest.approx(2 * net.fabric_latency_s + net.domain_latency_s)
    # A TP group (two neighbouring chips' ranks) is a grid: the runtime's torus rings.
    assert flat_ring(net.torus, 1, 8) is None
    # Halving-doubling below 56 MiB, the flat ring above.
    assert net.flat_ring(8, 32, "all_gather", 32 * 2**20) is None
    assert net.flat_ring(8, 32, "all_gather", 64 * 2**20) is ring


def test_z_rings_are_a_grid() -> None:
    # DP 4 across the UltraServer's instances: one Z ring per chip position.
    net = _net(SCENARIOS / "trn2-ultraserver-llama3-70b.yaml")
    assert net.torus is not None and flat_ring(net.torus, 64, 4) is None


def test_flat_ring_matches_the_simulated_gather() -> None:
    """The ZeRO-1 parameter all-gathers run alone after the Adam step, all 8 DP
    groups at once: the estimate's price of one is the simulated one's."""
    res = load_scenario(LANE_LOSS, ["failures={}", "training.steps=1"])
    frame = simulate(res).trace_frame()
    gathers = frame[frame["op"] == "dp.all_gather"]
    size = float(gathers["bytes"].mode()[0])  # the commonest bucket (whole parameters)
    same = gathers[gathers["bytes"] == size]
    simulated = float((same["end_s"] - same["start_s"]).median())
    net = _net(LANE_LOSS)
    est = Estimator(res.model, res.scenario.training, ChipModel(res.chip, res.lnc), net)
    assert est.coll_s(8, 32, "all_gather", size) == pytest.approx(simulated, rel=0.005)
