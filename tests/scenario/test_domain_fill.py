"""cluster.domain_fill: GB200 NVL72 racks filled with fewer trays than 18."""

from __future__ import annotations

import pytest

from clustersim.errors import ScenarioError
from clustersim.network import build_topology
from clustersim.scenario import load_scenario

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


def test_a_count_that_fills_no_whole_domain_says_how_to_fill_fewer() -> None:
    res = load_scenario(GB200, ["cluster.domain_fill=null"])
    with pytest.raises(ScenarioError, match=r"cluster\.domain_fill puts fewer in each"):
        build_topology(res.instance, res.chip, res.scenario.cluster.count)
