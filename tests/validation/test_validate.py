"""``clustersim validate``: the reference set, its rows, the command and its exit codes."""

from __future__ import annotations

import json
import math

import pytest

from clustersim import validation
from clustersim.cli import main
from clustersim.scenario import load_scenario
from clustersim.validation import (
    MEAN_TOLERANCE,
    closed_form_s,
    mean_training_error,
    passed,
    reference_names,
    validate,
)
from clustersim.validation.rows import CollectiveRef, References, Row, references
from clustersim.validation.training import megatron_flops_per_step, scenario_text

# (tp, pp, dp, global batch, seq len) of each published run
LAYOUTS = {
    "megatron-1.7b": (1, 1, 32, 512, 2048),
    "megatron-7.5b": (4, 1, 32, 512, 2048),
    "megatron-39.1b": (8, 2, 32, 1536, 2048),
    "megatron-145.6b": (8, 8, 24, 2304, 2048),
    "megatron-1008b": (8, 64, 6, 3072, 2048),
    "megatron-3.6b": (2, 1, 32, 512, 2048),
    "megatron-18.4b": (8, 1, 32, 1024, 2048),
    "megatron-76.1b": (8, 4, 32, 1792, 2048),
    "megatron-310.1b": (8, 16, 15, 2160, 2048),
    "megatron-529.6b": (8, 35, 9, 2520, 2048),
    "trn1-llama2-7b": (8, 1, 64, 1024, 4096),
    "t1-llama2-7b": (8, 1, 64, 1024, 4096),
    "t5-llama2-13b": (8, 4, 32, 1024, 4096),
    "t6-llama2-70b": (32, 4, 8, 1024, 4096),
    "n1-gpt3-6.7b": (8, 1, 4, 64, 2048),
    "n2-gpt3-6.7b": (8, 1, 64, 1024, 2048),
    "n3-gpt3-23b": (8, 4, 32, 1024, 2048),
    "n4-gpt3-46b": (8, 8, 16, 1024, 2048),
    "n5-llama2-7b": (8, 1, 64, 256, 4096),
    "n6-llama2-7b": (8, 4, 32, 1024, 4096),
    "n7-llama2-13b": (8, 4, 16, 1024, 4096),
    "n8-llama2-13b": (8, 4, 32, 1024, 4096),  # printed as 16 instances; DP 32 needs 32
    "b1-bert-large": (1, 1, 32, 16384, 128),
    "b5-bert-large": (1, 1, 32, 32768, 512),
    "b2-bert-large": (1, 1, 512, 1048576, 128),
    "b3-bert-large": (1, 1, 512, 524288, 512),
    "nemo-gpt3-175b-512": (4, 8, 16, 2048, 2048),
    "nemo-gpt3-175b-128": (4, 8, 4, 256, 2048),
    "nemo-llama2-7b": (1, 1, 8, 128, 4096),
    "nemo-llama2-70b": (4, 4, 4, 128, 4096),
    "nemo-llama3-8b": (1, 1, 4, 128, 8192),  # and cp 2
    "nemo-llama3-70b": (4, 4, 2, 128, 8192),  # and cp 2
    "bridge-llama31-405b": (4, 8, 2, 64, 8192),  # and cp 2, vp 8 (G12)
    "nemo-nemotron-340b": (8, 8, 2, 32, 4096),
    "llama3-405b": (8, 16, 64, 2048, 8192),
    "bridge-deepseek-v3": (2, 8, 64, 8192, 4096),
    "bridge-llama3-8b-fsdp": (1, 1, 8, 128, 8192),  # and zero 3 (G8)
    "bridge-qwen3-30b-a3b": (1, 2, 8, 512, 4096),  # and vp 24, ep 8 (G15)
}


def test_reference_set_covers_the_published_rows() -> None:
    refs = references()
    names = refs.names()
    assert len(names) == len(set(names))
    assert {r.name for r in refs.training} == set(LAYOUTS)
    assert {r.role for r in refs.training} == {"calibration", "holdout"}
    assert all(r.tolerance == 0.10 for r in refs.training)
    assert all(r.tolerance == 0.01 for r in refs.collectives)
    assert all(r.tolerance == 0.02 for r in refs.reliability)
    assert {r.formula for r in refs.collectives} >= {"ring", "halving_doubling", "pairwise"}
    quick = reference_names(quick=True)
    assert "megatron-1008b" not in quick and "megatron-1.7b" in quick
    assert "trn1-llama2-7b" in quick  # Trainium rows run in the default tests
    assert set(reference_names()) == set(names)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_scenarios_use_the_published_layout(name: str) -> None:
    ref = next(r for r in references().training if r.name == name)
    res = load_scenario(scenario_text(ref))
    par, tr = res.scenario.parallelism, res.scenario.training
    tp, pp, dp, batch, seq = LAYOUTS[name]
    assert (par.tp, par.pp, tr.global_batch_size, tr.seq_len) == (tp, pp, batch, seq)
    assert res.ranks == tp * pp * dp * par.cp
    if name.startswith("megatron"):
        assert (par.recompute, par.attention, par.sequence_parallel) == ("full", "unfused", False)
        assert res.instance.name == "dgx-a100"


def test_megatron_flop_formula() -> None:
    """96 B s l h^2 (1 + s/6h + V/16lh): the 1008B row at 163 TFLOP/s is a 102.6 s step."""
    ref = next(r for r in references().training if r.name == "megatron-1008b")
    res = load_scenario(scenario_text(ref))
    flops = megatron_flops_per_step(res)
    b, s, n, h, v = 3072, 2048, 128, 25600, 51200
    assert flops == pytest.approx(96 * b * s * n * h**2 * (1 + s / (6 * h) + v / (16 * n * h)))
    assert flops / (163e12 * 3072) == pytest.approx(102.6, rel=1e-3)


def test_closed_forms() -> None:
    a, b, n = 2e-6, 1e-9, 2.0**30
    assert closed_form_s("ring", "all_reduce", 8, n, a=a, b=b) == pytest.approx(
        14 * a + 2 * 7 / 8 * n * b
    )
    assert closed_form_s("halving_doubling", "all_reduce", 8, n, a=a, b=b) == pytest.approx(
        6 * a + 2 * 7 / 8 * n * b
    )
    assert closed_form_s("pairwise", "all_to_all", 8, n, a=a, b=b) == pytest.approx(
        7 * a + 7 / 8 * n * b
    )
    # a 4x4 torus: rings on x (4 ranks, n bytes), then y (n/4), both ways round
    torus = closed_form_s("torus", "all_gather", 16, n, a=a, b=b, dims=(4, 4))
    assert torus == pytest.approx(3 * a + 3 / 4 * n * b / 2 + 3 * a + 3 / 4 * (n / 4) * b / 2)


def test_analytic_rows_are_within_one_percent() -> None:
    refs = references()
    only = [r.name for r in (*refs.collectives, *refs.reliability)]
    rows = validate(only)
    assert [r.name for r in rows] == only
    for row in rows:
        assert row.passed, row
        if row.kind == "collective":
            assert abs(row.error) < 1e-6  # uncontended: the simulator is the closed form
    assert mean_training_error(rows) is None
    assert passed(rows)


def test_quick_end_to_end_rows_pass() -> None:
    """The fast end-to-end rows (Megatron-LM 1.7B, 7.5B, 39.1B on A100; Trn1) within tolerance."""
    quick = [r.name for r in references().training if not r.slow]
    rows = validate(quick)
    for row in rows:
        assert row.kind == "training"
        assert row.passed, (row.name, row.error)
        assert row.mfu_published is not None and row.mfu_predicted is not None
        # MFU is inversely proportional to the step time: the same error, inverted
        assert row.mfu_predicted / row.mfu_published == pytest.approx(1 / (1 + row.error))
    mean = mean_training_error(rows)
    assert mean is not None and mean <= MEAN_TOLERANCE


def test_a_row_out_of_tolerance_fails() -> None:
    row = Row("x", "training", "step time", "s", published=10.0, predicted=11.5, tolerance=0.1,
              source="test")  # fmt: skip
    assert math.isclose(row.error, 0.15) and not row.passed
    assert not passed([row])
    ok = Row("y", "training", "step time", "s", 10.0, 10.9, 0.1, "test")
    assert ok.passed
    # every row within 10%, but their mean |error| of 9% is above 6%
    below = Row("z", "training", "step time", "s", 10.0, 9.1, 0.1, "test")
    assert below.passed
    assert mean_training_error([ok, below]) == pytest.approx(0.09)
    assert not passed([ok, below])
    # rows picked by name (--only) are held to their own tolerances, not the set's mean
    assert passed([ok, below], whole_set=False)
    assert not passed([row, ok], whole_set=False)


# -- CLI ------------------------------------------------------------------------------------------


def test_cli_json_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--only", "ring-all-reduce-h100", "daly-interval-24h", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] is True
    assert [r["name"] for r in out["rows"]] == ["ring-all-reduce-h100", "daly-interval-24h"]
    for r in out["rows"]:
        assert {"published", "predicted", "error", "tolerance", "passed"} <= set(r)


def test_cli_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--only", "pairwise-all-to-all-h100"]) == 0
    out = capsys.readouterr().out
    assert "pairwise-all-to-all-h100" in out and "passed" in out


def test_cli_exits_1_when_a_row_misses(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    refs = references()
    wrong = CollectiveRef.model_validate(
        {**refs.collectives[0].model_dump(), "name": "wrong", "formula": "ring_duplex"}
    )  # half the bandwidth term: the switch's ring does not go both ways at once
    monkeypatch.setattr(
        validation, "references", lambda: References(training=(), collectives=(wrong,))
    )
    assert main(["validate", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] is False and out["rows"][0]["error"] > 0.5


def test_cli_unknown_reference_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--only", "megatron-2b"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--only: unknown reference; valid: megatron-1.7b" in err


@pytest.mark.slow
def test_full_reference_set_passes() -> None:
    """Every row, the 3,072- and 8,192-GPU runs folded: each in tolerance, mean within 6%."""
    rows = validate()
    # every reference, a measured collective as one row per size (NAME@SIZE)
    assert {r.name.partition("@")[0] for r in rows} == set(references().names())
    assert all(r.passed for r in rows), [(r.name, r.error) for r in rows if not r.passed]
    assert passed(rows)
