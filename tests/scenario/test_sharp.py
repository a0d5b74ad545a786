"""In-network reduction (InfiniBand SHARP) as a scenario asks for it: on where the
fabric has it, refused with exit 2 and the key named where it has not."""

from __future__ import annotations

import pytest

from clustersim.scenario import load_scenario
from clustersim.sim import plan
from tests.robustness.harness import assert_contract, case_dir, run_cli, write

DGX = (
    "name: dgx\ncluster: {instance: dgx-h100, count: 2}\n"
    "model: {name: llama3-8b, layers: 2}\nparallelism: {tp: 8}\n"
    "training: {seq_len: 2048, global_batch_size: 16}\n"
)


def test_dgx_h100_runs_sharp_and_turns_it_off() -> None:
    res = load_scenario(DGX, ["cluster.collectives.all_reduce=nvls_sharp"])
    assert res.instance.efa.sharp and res.instance.efa.network == "infiniband"
    plan(res)
    off = load_scenario(DGX, ["cluster.efa.sharp=false"])
    assert not off.instance.efa.sharp
    plan(off)


@pytest.mark.parametrize(
    ("sets", "where", "phrase"),
    [
        (["cluster.instance=p5.48xlarge", "cluster.collectives.all_reduce=sharp"],
         "cluster.collectives.all_reduce", "p5.48xlarge's scale-out network (efa) has none"),
        (["cluster.instance=p5-roce", "cluster.collectives.all_reduce=nvls_sharp"],
         "cluster.collectives.all_reduce", "(roce) has none"),
        (["cluster.efa.sharp=false", "cluster.collectives.all_reduce=sharp"],
         "cluster.collectives.all_reduce", "instances with it: dgx-b200, dgx-h100, dgx-h200"),
        (["cluster.instance=trn2.48xlarge", "cluster.collectives.all_reduce=sharp"],
         "cluster.collectives.all_reduce", "runs Neuron"),
        (["cluster.instance=p5.48xlarge", "cluster.efa.sharp=true"],
         "cluster.efa.sharp", "needs InfiniBand switches; this scale-out network is efa"),
        (["cluster.instance=trn2.48xlarge", "cluster.efa.sharp=true"],
         "cluster.efa.sharp", "needs InfiniBand switches"),
        (["cluster.efa.network=roce"], "cluster.efa.sharp", "this scale-out network is roce"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("command", ["check", "run"])
def test_sharp_on_a_fabric_without_it_exits_2_naming_the_key(
    sets: list[str], where: str, phrase: str, command: str
) -> None:
    with case_dir() as d:
        args = [command, str(write(d, DGX))]
        if command == "run":
            args += ["--out", str(d / "out"), "--quiet"]
        for s in sets:
            args += ["--set", s]
        outcome = run_cli(args)
    assert outcome.rc == 2, str(outcome)
    assert assert_contract(outcome) == where
    assert phrase in outcome.err, outcome.err
