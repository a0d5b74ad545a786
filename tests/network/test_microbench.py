"""The collective microbenchmark and ``clustersim collective``."""

from __future__ import annotations

import json

import pytest

from clustersim import catalog
from clustersim.cli import main
from clustersim.errors import ScenarioError
from clustersim.network.microbench import busbw_factor, run_collective, size_sweep

MIB, GIB = 2.0**20, 2.0**30


def test_busbw_factors_follow_nccl_tests() -> None:
    assert busbw_factor("all_reduce", 16) == pytest.approx(2 * 15 / 16)
    for op in ("reduce_scatter", "all_gather", "all_to_all"):
        assert busbw_factor(op, 8) == pytest.approx(7 / 8)
    assert busbw_factor("broadcast", 8) == busbw_factor("reduce", 8) == 1.0


def test_rows_on_one_trn2_instance() -> None:
    rows = run_collective("trn2.48xlarge", 1, "all_reduce", [64e3, 4 * MIB, GIB])
    assert [r["algorithm"] for r in rows] == ["mesh", "halving_doubling", "torus"]
    for r in rows:
        assert set(r) == {
            "op", "size_bytes", "time_s", "algbw_GBps", "busbw_GBps", "algorithm", "protocol",
            "ranks",
        }  # fmt: skip
        assert r["ranks"] == 16
        assert r["algbw_GBps"] == pytest.approx(r["size_bytes"] / r["time_s"] / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 30 / 16)
    # a large all-reduce on the 4x4 torus: rings along x then y, both directions of each
    # link; the wire alone, then the runtime's launch and a handshake per ring round (the
    # 12 rounds of reduce-scatter and all-gather along x and y, each posting both ways)
    link_GBps = 128 * 0.85  # catalog link bandwidth x the trn2 calibration's efficiency
    (bare,) = run_collective("trn2.48xlarge", 1, "all_reduce", [GIB], overheads=False)
    assert bare["busbw_GBps"] == pytest.approx(2 * link_GBps, rel=0.05)
    c = catalog.chip("trn2").collectives
    fixed = c.launch_s + 12 * (c.ring_step_s + 2 * c.message_s)
    assert rows[-1]["time_s"] - bare["time_s"] == pytest.approx(fixed, rel=0.01)


def test_ranks_lnc_and_algorithm() -> None:
    (row,) = run_collective("trn2.48xlarge", 1, "all_gather", [GIB], algorithm="torus", lnc=2)
    assert (row["ranks"], row["algorithm"]) == (64, "torus")
    (row,) = run_collective("trn2.48xlarge", 1, "all_gather", [GIB], ranks=4)
    assert row["ranks"] == 4
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 3 / 4)


def test_hierarchical_across_instances_and_the_3d_ultraserver() -> None:
    (row,) = run_collective("trn2.48xlarge", 2, "all_reduce", [GIB])
    assert (row["ranks"], row["algorithm"]) == (32, "hierarchical")
    ring, torus = (
        run_collective("trn2u.48xlarge", 4, "all_reduce", [GIB], algorithm=alg)[0]
        for alg in ("ring", "torus")
    )
    assert ring["ranks"] == torus["ranks"] == 64
    assert torus["algorithm"] == "torus"
    assert torus["time_s"] < ring["time_s"]


def test_bad_input_names_the_parameter() -> None:
    with pytest.raises(ScenarioError, match=r"^op: unknown collective"):
        run_collective("trn2.48xlarge", 1, "allreduce", [MIB])
    with pytest.raises(ScenarioError, match=r"^algorithm: not one for all_to_all"):
        run_collective("trn2.48xlarge", 1, "all_to_all", [MIB], algorithm="ring")
    with pytest.raises(ScenarioError, match=r"^ranks: must be between 2 and the 16"):
        run_collective("trn2.48xlarge", 1, "all_reduce", [MIB], ranks=17)
    with pytest.raises(ScenarioError, match=r"^lnc: trn2 supports"):
        run_collective("trn2.48xlarge", 1, "all_reduce", [MIB], lnc=4)
    with pytest.raises(ScenarioError, match=r"^sizes: each size"):
        run_collective("trn2.48xlarge", 1, "all_reduce", [0.0])
    with pytest.raises(ScenarioError, match=r"^instance: unknown instance"):
        run_collective("trn9", 1, "all_reduce", [MIB])


def test_size_sweep() -> None:
    assert size_sweep(MIB, 8 * MIB) == [MIB, 2 * MIB, 4 * MIB, 8 * MIB]
    assert size_sweep(1e3, 1e5, 10) == pytest.approx([1e3, 1e4, 1e5])
    assert size_sweep(MIB, 3 * MIB) == [MIB, 2 * MIB]
    with pytest.raises(ScenarioError, match=r"^factor"):
        size_sweep(1, 2, 1.0)
    with pytest.raises(ScenarioError, match=r"^max"):
        size_sweep(2, 1)


# -- CLI ------------------------------------------------------------------------------------------


def test_cli_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["collective", "--instance", "trn2.48xlarge", "--op", "all_reduce"]
    assert main([*args, "--size", "1MiB", "--size", "4GiB"]) == 0
    out = capsys.readouterr().out
    assert "busbw" in out
    assert "halving_doubling" in out
    assert main([*args, "--min", "1MiB", "--max", "8MiB", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["size_bytes"] for r in rows] == [MIB, 2 * MIB, 4 * MIB, 8 * MIB]
    assert {"time_s", "algbw_GBps", "busbw_GBps", "algorithm"} <= set(rows[0])
    assert main([*args, "--size", "1GiB", "--algorithm", "ring_uni", "--ranks", "8", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["algorithm"], row["ranks"]) == ("ring_uni", 8)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--size", "1XB"], "--size: unknown size unit 'XB'"),
        (["--size=-1MiB"], "--size:"),
        (["--size", "0"], "--size: each size must be a positive number of bytes (got 0.0)"),
        ([], "--size: give at least one --size"),
        (["--size", "1MiB", "--algorithm", "fast"], "--algorithm: not one for all_reduce"),
        (["--size", "1MiB", "--count", "two"], "--count: expected an integer (got 'two')"),
        (["--size", "1MiB", "--ranks", "1"], "--ranks: must be between 2"),
        (["--min", "1MiB", "--max", "1MiB", "--factor", "0.5"], "--factor: must be a number"),
        (["--size", "1MiB", "--op", "gossip"], "--op: unknown collective"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main(["collective", "--instance", "trn2.48xlarge", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"clustersim: error: {message}" in err
