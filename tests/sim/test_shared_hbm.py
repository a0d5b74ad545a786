"""HBM shared, not split: compute runs and flows share a chip's HBM max-min (by hand)."""

from __future__ import annotations

import json
from collections.abc import Generator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simpy
from program_helpers import BREAKDOWN_PARTS
from simpy_helpers import finish_times

from clustersim.cli import main
from clustersim.network.fabric import Topology, chip_node
from clustersim.network.flows import FlowNetwork
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


def _run_at(
    env: simpy.Environment, runs: ComputeRuns, start_s: float, nbytes: float, seconds: float
) -> dict[str, float]:
    """Rank 0 starts a run at ``start_s``; the dict gets its end."""
    done: dict[str, float] = {}

    def rank() -> Generator[simpy.Event, Any, None]:
        yield env.timeout(start_s)
        runs.begin(0, nbytes, seconds)
        yield env.timeout(seconds)
        rest = runs.end(0)
        if rest is not None:
            yield rest
        done["compute"] = float(env.now)

    env.process(rank())
    return done


def test_a_run_beside_a_flow_with_room_on_the_hbm_stays_one_timeout() -> None:
    # 50 GB/s of compute and at most 40 GB/s of flow fit the chip's 100 GB/s: the HBM
    # row cannot bind, so the run keeps its fast path and the flow its link rate.
    env, flows = _flows()
    runs = ComputeRuns(env, flows, [0])
    done = _run_at(env, runs, 0.0, 50 * GB, 1.0)
    (t_flow,) = finish_times(env, [flows.transfer([(0, 1)], 40 * GB, 0.0)])
    assert done["compute"] == 1.0 and t_flow == pytest.approx(1.0, rel=1e-12)
    assert runs.fluid_runs == 0
    assert not flows.hbm.hot.any()  # type: ignore[union-attr]


def test_a_flow_in_flight_gets_its_chips_hbm_row_when_a_run_turns_it_hot() -> None:
    # HBM 60 GB/s. An 80 GB flow moves at its link's 40 alone. At 0.5 s a run asking
    # the whole 60 GB/s (30 GB in 0.5 s) starts on chip 0: 40 + 60 > 60, so the chip
    # turns hot and the flow (60 GB left) shares chip 0's HBM with the run, 30 each.
    # The run's 30 GB end at 1.5 s; the flow then has 30 GB left at 40: 2.25 s.
    # Chip 1's HBM (only the flow, 40 of 60) stays out of the solve.
    env = simpy.Environment()
    flows = FlowNetwork(env, _pair())
    flows.share_hbm(60 * GB)
    runs = ComputeRuns(env, flows, [0])
    done = _run_at(env, runs, 0.5, 30 * GB, 0.5)
    (t_flow,) = finish_times(env, [flows.transfer([(0, 1)], 80 * GB, 0.0)])
    assert done["compute"] == pytest.approx(1.5, rel=1e-12)
    assert t_flow == pytest.approx(2.25, rel=1e-12)
    assert runs.fluid_runs == 1
    assert not flows.hbm.hot.any()  # type: ignore[union-attr]  # cooled with the flow gone


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
    # HBM cannot bind (10 + 40 GB/s of 100): the run stays out of the flow model.
    assert (runs.fluid_runs, runs.stretched_runs) == (0, 1)
    # From t = 0 the run moves at 0.75 x 10 GB/s: 10 GB take 4/3 s.
    assert env.now == pytest.approx(2.0)  # the flow's end; the run ended at 4/3 s


def test_collectives_take_sms_only_while_they_run() -> None:
    # f = 0.25. A run of 10 GB in 1 s (HBM is not the limit) meets an 8 GB flow from
    # 0.2 s to 0.4 s (link 40 GB/s): 2 GB at full speed, 1.5 GB at 0.75 x 10 GB/s while
    # the flow runs, then the last 6.5 GB at full speed again: the run ends at 1.05 s,
    # stretched by f x 0.2 s.
    env, flows = _flows()
    runs = ComputeRuns(env, flows, [0], sm_fraction=0.25)
    done = _run_at(env, runs, 0.0, 10 * GB, 1.0)

    def collective() -> Generator[simpy.Event, Any, None]:
        yield env.timeout(0.2)
        yield flows.transfer([(0, 1)], 8 * GB, 0.0)
        done["flow"] = float(env.now)

    env.process(collective())
    env.run()
    assert done["flow"] == pytest.approx(0.4, rel=1e-12)
    assert done["compute"] == pytest.approx(1.05, rel=1e-12)


GPU_TINY = """\
name: gpu-tiny
seed: 0
cluster: {{instance: p5.48xlarge, count: 1, chip: {{collective_sm_fraction: {f}}}}}
chip_model: {model}
model: {{name: tiny, layers: 4, hidden: 1024, heads: 8, kv_heads: 2, ffn_hidden: 4096, vocab: 8192}}
parallelism: {{tp: 2, pp: 1, zero: 1, schedule: 1f1b, recompute: selective}}
training: {{seq_len: 1024, global_batch_size: 32, steps: 1}}
"""


@pytest.mark.parametrize("model", ["roofline", "engines"])
def test_overlapped_compute_is_slowed_by_the_collectives_sms(tmp_path: Path, model: str) -> None:
    # The data-parallel gradient reduce-scatter overlaps the backward on 4 replicas:
    # with NCCL's SMs taken, that compute is stretched, and the breakdown says so.
    from clustersim.scenario import load_scenario
    from clustersim.sim import simulate

    out = {}
    for f in (0.0, 0.25):
        path = tmp_path / f"gpu-{f}.yaml"
        path.write_text(GPU_TINY.format(f=f, model=model))
        out[f] = simulate(load_scenario(path), record=False).summary
    free, taken = out[0.0], out[0.25]
    assert free["breakdown_s"]["interference"] == pytest.approx(0.0, abs=1e-9)
    stretch = taken["breakdown_s"]["interference"]
    assert stretch > 0
    # Never more than f / (1 - f) of the compute: a run is at least (1 - f) fast.
    assert stretch <= 0.25 / 0.75 * taken["breakdown_s"]["compute"]
    # The stretched backward waits that much less for its reduce-scatter: the step
    # grows by at most the stretch (not at all where the collective bounds it).
    grew = taken["step_time_s"] - free["step_time_s"]
    assert -1e-12 <= grew <= stretch * (1 + 1e-9)


def test_breakdown_has_interference_and_sums_to_the_step(
    tiny_yaml: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o"
    assert main(["run", str(tiny_yaml), "--out", str(out), "--json", "--no-report"]) == 0
    s = json.loads(capsys.readouterr().out)
    parts = s["breakdown_s"]
    assert set(parts) == BREAKDOWN_PARTS
    assert parts["interference"] >= 0
    assert sum(parts.values()) == pytest.approx(s["step_time_s"], rel=1e-9)


def _sm_schedule(seed: int, strict: bool) -> list[float]:
    """Both ranks' runs and flows both ways at random times, with SMs taken (f = 0.2):
    the end of every run and flow. ``strict`` puts every chip with a flow in the solve."""
    rng = np.random.default_rng(seed)
    env = simpy.Environment()
    flows = FlowNetwork(env, _pair())
    flows.share_hbm(HBM)
    runs = ComputeRuns(env, flows, [0, 1], sm_fraction=0.2)
    assert flows.hbm is not None
    flows.hbm.strict = strict
    ends: list[float] = []

    def rank(pos: int) -> Generator[simpy.Event, Any, None]:
        for _ in range(6):
            yield env.timeout(float(rng.uniform(0.0, 0.3)))
            # From a few GB/s to past what the HBM has beside a flow (then it binds).
            seconds = float(rng.uniform(0.05, 0.5))
            runs.begin(pos, float(rng.uniform(0.5, 40.0)) * GB * seconds, seconds)
            yield env.timeout(seconds)
            rest = runs.end(pos)
            if rest is not None:
                yield rest
            ends.append(float(env.now))

    def traffic(src: int) -> Generator[simpy.Event, Any, None]:
        for _ in range(5):
            yield env.timeout(float(rng.uniform(0.0, 0.4)))
            yield flows.transfer([(src, 1 - src)], float(rng.uniform(1.0, 12.0)) * GB, 0.0)
            ends.append(float(env.now))

    for pos in (0, 1):
        env.process(rank(pos))
        env.process(traffic(pos))
    env.run()
    return sorted(ends)


@pytest.mark.parametrize("seed", range(8))
def test_runs_slowed_by_sms_outside_the_solve_end_as_the_solve_has_them(seed: int) -> None:
    # A run kept out of the flow model while its chip's HBM cannot bind, moving at the
    # rate the collectives' SMs leave it, ends when the max-min solve with every chip's
    # HBM row in it (strict) ends it; and so does every flow.
    fast, exact = _sm_schedule(seed, strict=False), _sm_schedule(seed, strict=True)
    assert fast == pytest.approx(exact, rel=1e-9)
