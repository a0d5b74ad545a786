"""Failures during serving: conservation of requests, the outage, and a lost lane's cost."""

from __future__ import annotations

import pytest
from serve_helpers import Fixed

from clustersim.errors import ScenarioError
from clustersim.scenario import load_scenario
from clustersim.serve.collectives import TpAllReduce
from clustersim.serve.iteration import ACT_BYTES
from clustersim.serve.run import serve
from clustersim.serve.sim import Fault, ServeSim


def scenario(failures: str, *, tp: int = 16, extra: str = "", **serving: object) -> str:
    keys = {
        "engine": "vllm",
        "arrival": "{kind: closed, concurrency: 1}",
        "requests": 3,
        "input_tokens": 128,
        "output_tokens": 33,
        **serving,
    }
    body = "".join(f"  {k}: {v}\n" for k, v in keys.items())
    return (
        f"name: serve-fail\ncluster: {{instance: trn2.48xlarge{extra}}}\nmodel: llama3-8b\n"
        f"parallelism: {{tp: {tp}}}\nserving:\n{body}failures:\n{failures}"
    )


@pytest.mark.parametrize("engine", ["vllm", "trtllm", "neuron"])
@pytest.mark.parametrize("collapse", [True, False])
def test_requests_are_conserved_when_a_replica_fails(engine: str, collapse: bool) -> None:
    """Replica 0 fails at 3 s with requests in flight: every request still finishes
    once with all its tokens, those it held are retried, and it runs nothing until
    it is back (detection 0.5 s + restart 2 s)."""
    sim = ServeSim(
        [Fixed(0.01), Fixed(0.012), Fixed(0.015)], engine=engine, max_num_seqs=8,
        max_num_batched_tokens=256, kv_blocks=8 * 30, requests=400, input_tokens=300,
        output_tokens=[20 + 7 * (i % 11) for i in range(400)], arrival=("poisson", 40.0),
        seed=4, slot_tokens=480, collapse=collapse, record=True,
        faults=[Fault(0, 3.0, (0,), down=True, detect_s=0.5, restart_s=2.0)],
    )  # fmt: skip
    reqs = sim.run()
    assert len(reqs) == 400
    assert all(r.generated == r.output_tokens for r in reqs)
    assert all(r.finish >= r.first_token >= r.arrival for r in reqs)
    (record,) = sim.fault_records
    assert record["replicas"] == [0] and record["requests_in_flight"] > 0
    assert (record["detected_s"], record["back_s"]) == (3.5, 5.5)
    retried = [r for r in reqs if r.retries]
    assert len(retried) == record["requests_resent"] >= record["requests_in_flight"]
    assert all(r.replica != 0 or r.arrival >= 3.5 for r in retried)  # resent elsewhere
    failed = sim.replicas[0]
    assert failed.log is not None
    assert not [row for row in failed.log if 3.0 <= row[0] < 5.5]  # down: nothing runs
    assert any(row[0] >= 5.5 for row in failed.log)  # back, and sent work again
    assert sum(row[6] for row in failed.log) == 1  # the iteration cut short
    for rep in sim.replicas:
        assert rep.log is not None
        assert sum(row[1] for row in rep.log) == pytest.approx(rep.busy_s, rel=1e-12)
        assert sum(row[4] for row in rep.log) == rep.iterations
        assert rep.used_blocks == 0 and not rep.running and not rep.waiting


def test_requests_wait_for_a_replica_when_all_are_down() -> None:
    sim = ServeSim(
        [Fixed(0.01)], engine="vllm", max_num_seqs=8, max_num_batched_tokens=256,
        kv_blocks=200, requests=50, input_tokens=100, output_tokens=10,
        arrival=("poisson", 20.0), seed=1,
        faults=[Fault(0, 1.0, (0,), down=True, detect_s=0.2, restart_s=1.0)],
    )  # fmt: skip
    reqs = sim.run()
    assert all(r.generated == 10 for r in reqs)
    waited = [r for r in reqs if 1.0 <= r.arrival < 2.2]
    assert waited and all(r.first_token > 2.2 for r in waited)


def _expected_tpot_delta(text: str, pair: tuple[int, int]) -> float:
    """What the collective model says a lost lane between ``pair`` adds to a batch-1
    decode step: two all-reduces a layer, each of one row of activations, timed on
    the replica's fabric with the lane gone (one fewer lane; with one lane per link,
    the link down and routed around)."""
    res = load_scenario(text)
    healthy = TpAllReduce(res, res.scenario.parallelism.tp)
    lost = TpAllReduce(res, res.scenario.parallelism.tp)
    topo = lost.topology
    u, v = topo.node(pair[0]), topo.node(pair[1])
    for link in (topo.link(u, v), topo.link(v, u)):
        topo.set_lanes_up(link, topo.lanes_up(link) - 1)
    nbytes = float(res.model.hidden * ACT_BYTES)
    assert lost(nbytes) > healthy(nbytes)
    return 2 * res.model.layers * (lost(nbytes) - healthy(nbytes))


@pytest.mark.parametrize("lanes", [1, 2])
def test_a_lost_lane_slows_tpot_by_what_the_collective_model_says(lanes: int) -> None:
    extra = f", neuronlink: {{lanes: {lanes}}}"
    lane = "  inject: [{at: 0, target: {lane: [0, 1]}, kind: down}]\n"
    slow = serve(load_scenario(scenario(lane, extra=extra, replicas=1))).summary
    fast = serve(load_scenario(scenario("  inject: []\n", extra=extra, replicas=1))).summary
    delta = slow["tpot_s"]["mean"] - fast["tpot_s"]["mean"]
    healthy = scenario("  inject: []\n", extra=extra)
    assert delta == pytest.approx(_expected_tpot_delta(healthy, (0, 1)))
    (inj,) = slow["failures"]["injections"]
    assert inj["replicas"] == [0]
    assert inj["decode_allreduce_s"]["after"] > inj["decode_allreduce_s"]["before"]
    assert slow["failures"]["requests_retried"] == 0


def test_a_chip_failure_shows_in_the_summary() -> None:
    text = scenario(
        "  detection_time: 1s\n  restart_time: 5s\n"
        "  inject: [{at: 4s, target: {chip: 5}, kind: down}]\n",
        arrival="{kind: poisson, rate_per_s: 20}", requests=300, output_tokens=64,
    )  # fmt: skip
    s = serve(load_scenario(text)).summary
    assert s["requests_finished"] == 300
    f = s["failures"]
    (inj,) = f["injections"]
    assert inj["replicas"] == [1]  # chips 4-7 at tp 16
    assert (inj["applied_s"], inj["detected_s"], inj["back_s"]) == (4.0, 5.0, 10.0)
    assert f["requests_retried"] == inj["requests_resent"] > 0
    assert inj["requests_in_flight"] > 0 and f["kv_tokens_lost"] > 0
    assert f["requests_unfinished"] == 0
    assert inj["around"]["e2e_s"]["p99"] > inj["before"]["e2e_s"]["p99"]


def test_no_failures_change_nothing() -> None:
    base = scenario("  inject: []\n", arrival="{kind: poisson, rate_per_s: 4}", requests=40)
    plain = serve(load_scenario(base)).summary
    late = base.replace("inject: []", "inject: [{at: 1h, target: {lane: [8, 9]}}]")
    after = serve(load_scenario(late)).summary
    for key in ("ttft_s", "tpot_s", "e2e_s", "iterations"):
        assert after[key] == plain[key]
    assert "failures" not in plain and "failures" in after


@pytest.mark.parametrize(
    ("failures", "key"),
    [
        ("  inject: [{at: 1, target: {chip: 99}}]\n", "failures.inject.0.target.chip"),
        ("  inject: [{at: -1, target: {chip: 1}}]\n", "failures.inject.0.at"),
        ("  inject: [{at: 1, target: {lane: [0, 9]}}]\n", "failures.inject.0.target.lane"),
        ("  inject: [{at: 1, target: {instance: 3}}]\n", "failures.inject.0.target.instance"),
        ("  inject: [{target: {chip: 1}, kind: {straggle: 2}}]\n", "failures.inject.0.kind"),
        ("  inject: [{target: {chip: 1}, kind: up}]\n", "failures.inject.0.kind"),
        ("  inject: [{target: {nic: 0}}]\n", "failures.inject.0.target.nic"),
        ("  preset: llama3-54d\n  inject: [{target: {chip: 1}}]\n", "failures.preset"),
    ],
)
def test_bad_failures_name_the_key(failures: str, key: str) -> None:
    with pytest.raises(ScenarioError) as info:
        serve(load_scenario(scenario(failures)))
    assert info.value.path == key


def test_a_failed_replica_in_a_disaggregated_run_is_refused() -> None:
    text = scenario(
        "  inject: [{target: {chip: 0}}]\n",
        tp=8,
        disaggregation="{prefill_replicas: 2, decode_replicas: 6}",
    )
    with pytest.raises(ScenarioError) as info:
        serve(load_scenario(text))
    assert info.value.path == "failures.inject.0.target.chip"


def test_a_measured_allreduce_on_a_failed_fabric_scales_by_the_simulated_slowdown() -> None:
    """A GPU replica's healthy all-reduce is its engine's measured kernel; on a fabric
    with failures it is that kernel's time times the simulated slowdown (with nothing
    failed, the measured time itself), so a failure never makes it faster."""
    from clustersim.serve.faults import LinkStateAllReduce

    text = (
        "name: nvl\ncluster: {instance: p5.48xlarge}\nmodel: llama3-8b\n"
        "parallelism: {tp: 8}\n"
        "serving: {engine: vllm, arrival: {kind: poisson, rate_per_s: 5}}\n"
    )
    res = load_scenario(text)
    measured = TpAllReduce(res, 8, engine="vllm")
    assert measured.measured is not None
    nbytes = 4096 * 2.0
    same = LinkStateAllReduce(res, measured, 0, [], detect_delay_s=0.0)
    assert same(nbytes) == pytest.approx(measured(nbytes), rel=1e-12)
    assert same(nbytes) < measured.simulated_s(nbytes)
