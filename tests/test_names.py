"""Names people type: hyphens read as underscores, canonical names printed, and the
closest valid name suggested for a near miss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scenario_texts import TINY

from clustersim.cli import main
from clustersim.errors import ScenarioError
from clustersim.names import canonical, check, closest
from clustersim.scenario import load_scenario
from clustersim.sim import simulate


def test_canonical_and_closest() -> None:
    assert canonical("All-Reduce") == "all_reduce"
    assert canonical("halving-doubling") == "halving_doubling"
    assert canonical("1F1B") == "1f1b"
    valid = ["on_demand", "reserved", "capacity_block", "owned"]
    assert closest("ondemand", valid) == "on_demand"
    assert closest("capacity-blok", valid) == "capacity_block"
    assert closest("zzzzzz", valid) is None
    assert check("p", "Capacity-Block", valid, "unknown mode") == "capacity_block"
    with pytest.raises(ScenarioError, match=r"^p: unknown mode; did you mean 'reserved'\?"):
        check("p", "reservd", valid, "unknown mode")


@pytest.mark.parametrize(
    ("override", "attr", "expected"),
    [
        ("cost.pricing=on-demand", ("cost", "pricing"), "on_demand"),
        ("cost.pricing=Capacity-Block", ("cost", "pricing"), "capacity_block"),
        ("parallelism.schedule=GPipe", ("parallelism", "schedule"), "gpipe"),
    ],
)
def test_typed_names_resolve_to_canonical(
    override: str, attr: tuple[str, str], expected: str
) -> None:
    res = load_scenario(TINY, [override])
    section = getattr(res.scenario, attr[0])
    assert getattr(section, attr[1]) == expected


def test_hyphenated_collectives_run_as_the_canonical_ones() -> None:
    typed = load_scenario(TINY, ["cluster.collectives.all-reduce=halving-doubling"])
    spelled = load_scenario(TINY, ["cluster.collectives.all_reduce=halving_doubling"])
    assert typed.scenario.cluster.collectives == {"all_reduce": "halving_doubling"}
    a, b = simulate(typed, record=False).summary, simulate(spelled, record=False).summary
    assert a["step_time_s"] == b["step_time_s"]


def test_a_collective_given_twice_is_refused() -> None:
    text = TINY.replace(
        "cluster: {instance: trn2.48xlarge, count: 1}",
        "cluster: {instance: trn2.48xlarge, count: 1, "
        "collectives: {all_reduce: ring, all-reduce: mesh}}",
    )
    with pytest.raises(ScenarioError, match="same collective"):
        load_scenario(text)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("cost.pricing=ondemand", "cost.pricing: Input should be"),
        ("parallelism.schedule=gpip", "parallelism.schedule: Input should be"),
        ("cluster.collectives.allreduce=ring", "cluster.collectives: unknown collective"),
        (
            "cluster.collectives.all-reduce=rign",
            "cluster.collectives.all_reduce: unknown algorithm",
        ),
        (
            "cluster.collectives.all-to-all=ring",
            "cluster.collectives.all_to_all: algorithm does not implement all_to_all",
        ),
    ],
)
def test_near_misses_name_the_closest_valid_value(
    override: str, message: str, tiny_yaml: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", str(tiny_yaml), "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"clustersim: error: {message}"), err
    near = {
        "ondemand": "on_demand",
        "gpip": "gpipe",
        "allreduce": "all_reduce",
        "rign": "ring",
        "all-to-all=ring": "pairwise",
    }
    expected = next(v for k, v in near.items() if k in override)
    if expected != "pairwise":  # 'ring' is too far from both all-to-all algorithms
        assert f"did you mean {expected!r}?" in err


def test_collective_accepts_nccl_tests_names_and_prints_the_canonical_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["collective", "--instance", "trn2.48xlarge", "--size", "1MiB", "--json"]
    assert main([*base, "--op", "all-reduce", "--algorithm", "halving-doubling"]) == 0
    typed = json.loads(capsys.readouterr().out)
    assert main([*base, "--op", "all_reduce", "--algorithm", "halving_doubling"]) == 0
    spelled = json.loads(capsys.readouterr().out)
    assert typed[0]["op"] == "all_reduce" and typed[0]["algorithm"] == "halving_doubling"
    assert typed[0]["time_s"] == spelled[0]["time_s"]
    assert main([*base[:-1], "--op", "reduce-scatter"]) == 0
    assert capsys.readouterr().out.startswith("reduce_scatter on 1 x trn2.48xlarge")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--op", "allreduce"], "--op: unknown collective; did you mean 'all_reduce'?"),
        (["--op", "all-gathr"], "--op: unknown collective; did you mean 'all_gather'?"),
        (["--algorithm", "rign"], "--algorithm: not one for all_reduce; did you mean 'ring'?"),
    ],
)
def test_collective_near_misses(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["collective", "--instance", "trn2.48xlarge", "--size", "1MiB", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"clustersim: error: {message}")
