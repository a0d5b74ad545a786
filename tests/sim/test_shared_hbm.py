"""HBM shared, not split: compute runs and flows share a chip's HBM max-min (by hand)."""

from __future__ import annotations

import json
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
import simpy
from simpy_helpers import finish_times

from clustersim.cli import main
from clustersim.network.flows import FlowNetwork
from clustersim.network.topology import Topology, chip_node
from clustersim.sim.hbm import ComputeRuns

GB = 1e9
LINK = 40 * GB
HBM = 100 * GB


def _pair() -> Topology:
    """Two chips and one link each way."""
    topo = Topology("pair", chips_per_instance=2, local_bw_Bps=10 * LINK)
    topo.add_duplex(
        chip_node(0), chip_node(1), capacity_Bps=LINK, latency_s=0.0, lanes=1, kind="neuronlink"
    )
    return topo


def _flows() -> tuple[simpy.Environment, FlowNetwork]:
    env = simpy.Environment()
    flows = FlowNetwork(env, _pair())
    flows.share_hbm(HBM)
    return env, flows


def test_two_compute_users_of_one_chip_share_its_hbm_max_min() -> None:
    # Demands 30 and 100 GB/s on 100 GB/s: the small one gets all it asks, the big one
    # the rest (70); when the small one is done, the big one gets its full demand.
    env, flows = _flows()
    small = flows.transfer_group(flows.compute_group(0, 30 * GB), 30 * GB, 0.0)
    big = flows.transfer_group(flows.compute_group(0, 100 * GB), 140 * GB, 0.0)
    t_small, t_big = finish_times(env, [small, big])
    assert t_small == pytest.approx(1.0, rel=1e-12)
    assert t_big == pytest.approx(1.0 + (140 - 70) / 100, rel=1e-12)
    # Both over their fair share: 50 each.
    env, flows = _flows()
    a = flows.transfer_group(flows.compute_group(0, 70 * GB), 50 * GB, 0.0)
    b = flows.transfer_group(flows.compute_group(0, 70 * GB), 50 * GB, 0.0)
    assert finish_times(env, [a, b]) == pytest.approx([1.0, 1.0], rel=1e-12)


def test_a_flow_reads_its_source_hbm_and_writes_its_destination_hbm() -> None:
    # A compute run on each chip asks 80 of 100 GB/s; the flow (link 40) gets the
    # max-min share of both HBMs: 100 / 2 = 50 > 40, so the link bounds it at 40,
    # and each compute run gets the other 60.
    env, flows = _flows()
    c0 = flows.transfer_group(flows.compute_group(0, 80 * GB), 60 * GB, 0.0)
    c1 = flows.transfer_group(flows.compute_group(1, 80 * GB), 60 * GB, 0.0)
    flow = flows.transfer([(0, 1)], 40 * GB, 0.0)
    t0, t1, tf = finish_times(env, [c0, c1, flow])
    assert tf == pytest.approx(1.0, rel=1e-12)
    assert t0 == t1 == pytest.approx(1.0, rel=1e-12)


def test_a_collective_starting_mid_run_stretches_a_memory_bound_run() -> None:
    # A run that needs the whole HBM (100 GB in 1 s) meets a 40 GB flow at 0.5 s: the
    # flow takes the link's 40 GB/s of HBM, the run the remaining 60, so its last
    # 50 GB take 50/60 s instead of 0.5 s; then the flow runs alone to its end.
    env, flows = _flows()
    runs = ComputeRuns(env, flows, [0])
    done: dict[str, float] = {}

    def rank() -> Generator[simpy.Event, Any, None]:
        runs.begin(0, 100 * GB, 1.0)
        yield env.timeout(1.0)
        rest = runs.end(0)
        assert rest is not None  # it met the flow
        yield rest
        done["compute"] = float(env.now)

    def collective() -> Generator[simpy.Event, Any, None]:
        yield env.timeout(0.5)
        yield flows.transfer([(0, 1)], 40 * GB, 0.0)
        done["flow"] = float(env.now)

    env.process(rank())
    env.process(collective())
    env.run()
    assert done["compute"] == pytest.approx(0.5 + 50 / 60, rel=1e-12)
    assert done["flow"] == pytest.approx(1.5, rel=1e-12)
    assert runs.fluid_runs == 1


def test_a_run_alone_stays_one_timeout_and_collectives_are_capped_by_hbm() -> None:
    env, flows = _flows()
    runs = ComputeRuns(env, flows, [0])

    def rank() -> Generator[simpy.Event, Any, None]:
        runs.begin(0, 100 * GB, 1.0)
        yield env.timeout(1.0)
        assert runs.end(0) is None  # nothing shared its HBM: the fast path

    env.process(rank())
    env.run()
    assert env.now == 1.0
    assert runs.fluid_runs == 0
    # HBM below the link rate caps a flow: 20 GB/s of HBM, 40 GB/s of link.
    env = simpy.Environment()
    slow = FlowNetwork(env, _pair())
    slow.share_hbm(20 * GB)
    assert finish_times(env, [slow.transfer([(0, 1)], 20 * GB, 0.0)]) == [pytest.approx(1.0)]


def test_gpu_collectives_take_sms_from_compute(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A run with SM fraction f that meets a flow is capped at (1 - f) of its demand.
    env, flows = _flows()
    runs = ComputeRuns(env, flows, [0], sm_fraction=0.25)

    def rank() -> Generator[simpy.Event, Any, None]:
        runs.begin(0, 10 * GB, 1.0)  # 10 GB/s: HBM is not the limit
        yield env.timeout(1.0)
        rest = runs.end(0)
        assert rest is not None
        yield rest

    flow = flows.transfer([(0, 1)], 80 * GB, 0.0)
    env.process(rank())
    finish_times(env, [flow])
    assert runs.fluid_runs == 1
    # From t = 0 the run moves at 0.75 x 10 GB/s: 10 GB take 4/3 s.
    assert env.now == pytest.approx(2.0)  # the flow's end; the run ended at 4/3 s


def test_breakdown_has_interference_and_sums_to_the_step(
    tiny_yaml: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o"
    assert main(["run", str(tiny_yaml), "--out", str(out), "--json", "--no-report"]) == 0
    s = json.loads(capsys.readouterr().out)
    parts = s["breakdown_s"]
    assert set(parts) == {"compute", "exposed_comm", "bubble", "optimizer", "interference", "other"}
    assert parts["interference"] >= 0
    assert sum(parts.values()) == pytest.approx(s["step_time_s"], rel=1e-9)
