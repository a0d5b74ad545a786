"""cluster.domain_fill: GB200 NVL72 racks filled with fewer trays than 18."""

from __future__ import annotations

from typing import Any

import pytest
import simpy

from clustersim import catalog
from clustersim.errors import ScenarioError
from clustersim.failures.injection import resolve
from clustersim.failures.jobs import component_counts
from clustersim.network import Network, build_topology
from clustersim.network.runtimes import runtime_of
from clustersim.scenario import load_scenario
from clustersim.scenario.failures import Injection
from clustersim.sim.partialfold import partial_fold_refusal
from clustersim.workload import make_layout

GB200 = (
    "name: gb\ncluster: {instance: gb200-nvl72-node, count: 64, domain_fill: 16}\n"
    "model: {name: llama3-8b, layers: 2}\nparallelism: {tp: 4}\n"
    "training: {seq_len: 2048, global_batch_size: 64}\n"
)


def test_256_gb200s_in_four_racks_of_16_trays() -> None:
    res = load_scenario(GB200)
    assert res.chips == 256 and res.instance.ultraserver is not None
    assert res.instance.ultraserver.instances == 16
    topo = build_topology(res.instance, res.chip, res.scenario.cluster.count)
    assert topo.n_domains == 4 and topo.chips_per_domain == 64


@pytest.mark.parametrize(
    ("sets", "path", "problem"),
    [
        (["cluster.domain_fill=19"], "cluster.domain_fill", "holds 1 to 18"),
        (["cluster.instance=p5.48xlarge", "cluster.count=2", "cluster.domain_fill=1"],
         "cluster.domain_fill", "forms no UltraServer"),
        (["cluster.instance=trn2u.48xlarge", "cluster.count=4", "cluster.domain_fill=2"],
         "cluster.domain_fill", "built whole"),
    ],
)  # fmt: skip
def test_a_fill_out_of_range_is_refused_naming_the_key(
    sets: list[str], path: str, problem: str
) -> None:
    with pytest.raises(ScenarioError) as err:
        load_scenario(GB200, sets)
    assert err.value.path == path and problem in str(err.value)


def test_a_fabric_built_for_trays_that_fill_no_whole_rack_says_how_to_fill_them() -> None:
    inst = catalog.instance("gb200-nvl72-node")  # whole racks, as the catalog has them
    with pytest.raises(ScenarioError, match=r"cluster\.domain_fill puts fewer in each") as err:
        build_topology(inst, catalog.chip(inst.chip), 64)
    assert "domain_fill: last fills the last one partly" in str(err.value)


def test_a_count_of_trays_that_fills_no_whole_rack_fills_the_last_partly_by_default() -> None:
    res = load_scenario(GB200, ["cluster.domain_fill=null"])  # 64 trays: 18, 18, 18 and 10
    assert res.scenario.cluster.domain_fill == "last"
    assert res.instance.ultraserver is not None and res.instance.ultraserver.last_partial
    assert res.chips == 256
    topo = build_topology(res.instance, res.chip, res.scenario.cluster.count)
    assert topo.n_domains == 4
    whole = load_scenario(GB200, ["cluster.domain_fill=null", "cluster.count=72"])
    assert whole.scenario.cluster.domain_fill is None  # four whole racks stay as given


# -- cluster.domain_fill: last -------------------------------------------------------------------

LAST = GB200.replace("domain_fill: 16", "domain_fill: last")


def _run(text: str, sets: list[str], fidelity: str) -> dict[str, Any]:
    from clustersim.sim.run import simulate

    return simulate(load_scenario(text, sets), fidelity=fidelity, record=False).summary


def test_64_trays_fill_three_racks_and_ten_trays_of_the_last() -> None:
    res = load_scenario(LAST)
    assert res.chips == 256 and res.ranks == 256
    assert res.instance.ultraserver is not None and res.instance.ultraserver.last_partial
    assert res.instance.ultraserver.instances == 18
    topo = build_topology(res.instance, res.chip, 64)
    assert (topo.n_domains, topo.chips_per_domain, topo.filled_chips) == (4, 72, 256)
    assert topo.n_chips == 288  # the last rack's 8 empty slots are built and hold no ranks


def test_a_count_of_whole_racks_with_last_is_just_full() -> None:
    full = load_scenario(GB200, ["cluster.domain_fill=null", "cluster.count=72"])
    last = load_scenario(LAST, ["cluster.count=72"])
    a = build_topology(full.instance, full.chip, 72)
    b = build_topology(last.instance, last.chip, 72)
    assert (a.n_chips, a.n_domains, a.n_links) == (b.n_chips, b.n_domains, b.n_links)
    assert b.filled_chips == b.n_chips


def _allreduce_s(text: str, ranks: list[int]) -> float:
    res = load_scenario(text)
    topo = build_topology(res.instance, res.chip, res.scenario.cluster.count)
    env = simpy.Environment()
    net = Network(env, topo, list(range(res.ranks)), runtime=runtime_of(res.chip, res.instance))
    done = net.collective("all_reduce", ranks=ranks, nbytes=64e6)
    env.run(until=done)
    return float(env.now)


def test_a_tp_group_in_the_partial_rack_runs_at_nvlink_speed() -> None:
    first, last = _allreduce_s(LAST, [0, 1, 2, 3]), _allreduce_s(LAST, [252, 253, 254, 255])
    assert last == first
    # across racks the same group is slower: the partial rack's group stays on NVLink
    assert _allreduce_s(LAST, [0, 72, 144, 216]) > first


def test_a_dp_group_spans_the_partial_rack() -> None:
    res = load_scenario(LAST)
    topo = build_topology(res.instance, res.chip, 64)
    net = Network(simpy.Environment(), topo, list(range(res.ranks)))
    dp = list(range(0, 256, 4))  # tp 4: the data-parallel group of TP rank 0
    assert net.group_info(dp).domain_sizes() == (18, 18, 18, 10)


@pytest.mark.parametrize("sets", [[], ["parallelism.pp=2", "model.layers=4"]])
def test_the_partial_cluster_runs_folded_as_detailed(sets: list[str]) -> None:
    detailed = _run(LAST, sets, "detailed")
    folded = _run(LAST, sets, "folded")
    assert detailed["fidelity"] == "detailed" and folded["fidelity"] == "folded"
    # folding's contract (detailed within 1%); here its coflows differ by under 0.1%
    assert folded["step_time_s"] == pytest.approx(detailed["step_time_s"], rel=1e-3)
    assert detailed["chips"] == 256 and detailed["instances"] == 64
    assert _run(LAST, sets, "detailed")["step_time_s"] == detailed["step_time_s"]


def test_cost_and_energy_count_only_the_filled_trays() -> None:
    last = _run(LAST, [], "folded")
    whole = ["cluster.domain_fill=null", "cluster.count=72", "training.global_batch_size=72"]
    full = _run(GB200, whole, "folded")
    assert last["cost"]["usd_per_hour"] * 72 == pytest.approx(full["cost"]["usd_per_hour"] * 64)
    assert last["energy"]["power_kw"] * 72 == pytest.approx(full["energy"]["power_kw"] * 64)


def test_groups_split_unlike_across_the_partial_rack_are_not_folded() -> None:
    with pytest.raises(ScenarioError, match="cannot fold: the tp groups of stage 0"):
        _run(LAST, ["parallelism.tp=16"], "folded")
    res = load_scenario(LAST, ["parallelism.tp=16"])
    layout = make_layout(res.scenario.parallelism, res.ranks, 1, 4)
    assert partial_fold_refusal(res, layout) is not None
    assert partial_fold_refusal(load_scenario(LAST), make_layout(
        load_scenario(LAST).scenario.parallelism, 256, 1, 4)) is None  # fmt: skip


def test_groups_split_unlike_across_full_racks_are_not_folded() -> None:
    """tp 16 on racks of 72 GPUs: some TP groups stay in a rack, others cross two and run
    over the network; a folded step (one representative) would stand for the fast ones."""
    whole = ["cluster.domain_fill=null", "cluster.count=72", "training.global_batch_size=72"]
    with pytest.raises(ScenarioError, match="cannot fold: the tp groups of stage 0"):
        _run(GB200, [*whole, "parallelism.tp=16"], "folded")
    assert _run(GB200, whole, "folded")["fidelity"] == "folded"  # tp 4: every group alike


@pytest.mark.parametrize(
    ("sets", "problem"),
    [
        (["cluster.instance=trn2u.48xlarge", "cluster.count=6"], "built whole"),
        (["cluster.instance=p5.48xlarge", "cluster.count=2"], "forms no UltraServer"),
        (["cluster.domain_fill=first"], "cluster.domain_fill"),
        (["cluster.fabric_file=fabric.graphml"], "not read from cluster.fabric_file"),
    ],
)
def test_a_partial_last_domain_is_refused_naming_the_key(sets: list[str], problem: str) -> None:
    with pytest.raises(ScenarioError) as err:
        load_scenario(LAST, sets)
    assert err.value.path == "cluster.domain_fill" and problem in str(err.value)


def test_the_empty_slots_are_no_components_and_no_injection_targets() -> None:
    res = load_scenario(LAST)
    counts = component_counts(res)
    assert (counts["chip"], counts["instance"], counts["nic"]) == (256, 64, 256)
    assert counts["link"] == 2 * 256  # each GPU's NVLink and scale-out links, no empty slot's
    topo = build_topology(res.instance, res.chip, 64)
    targets = ({"chip": 256}, {"link": ["chip287", "chip0"]}, {"instance": 64}, {"nic": 70})
    for target in targets:
        down = Injection.model_validate({"at": 0.0, "kind": "down", "target": target})
        with pytest.raises(ScenarioError, match=r"0\.\.(255|63)"):
            resolve([down], topo)
