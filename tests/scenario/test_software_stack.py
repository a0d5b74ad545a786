"""software.stack: every scenario runs with its stack's fit, as a validation row does."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from clustersim.catalog.fits import calibration, fit_overrides, interval
from clustersim.catalog.stacks import describe_stack, stack_fit, stack_lines
from clustersim.cli import main
from clustersim.errors import ScenarioError
from clustersim.scenario import load_scenario
from clustersim.sim import simulate
from clustersim.validation.rows import references
from clustersim.validation.training import reference_stacks, run_training, scenario_text

P5 = (
    "name: s\ncluster: {instance: p5.48xlarge, count: 1}\nmodel: {name: llama3-8b, layers: 2}\n"
    "parallelism: {tp: 8}\ntraining: {seq_len: 2048, global_batch_size: 8}\n"
)
TRN1 = (
    "name: s\ncluster: {instance: trn1.32xlarge, count: 1}\nmodel: {name: llama3-8b, layers: 2}\n"
    "parallelism: {tp: 8}\ntraining: {seq_len: 2048, global_batch_size: 8}\n"
)


def test_a_scenario_without_a_stack_runs_its_familys_default_stack_with_its_fit() -> None:
    cal = calibration()
    for text, family in ((P5, "h100"), (TRN1, "trainium")):
        res = load_scenario(text)
        stack = cal.families[family].default_stack
        assert res.software.stack == stack and res.software.default
        fitted = fit_overrides(res.chip.name, stack)
        assert fitted and res.software.constants == fitted
        for name, value in fitted.items():
            assert getattr(res.chip.calibration, name) == value
    assert load_scenario(P5).software.stack == "megatron-core"
    assert load_scenario(TRN1).software.stack == "nxd-training"


def test_without_the_fit_the_chip_keeps_the_catalogs_constants() -> None:
    bare = load_scenario(TRN1, stack_fit=False)
    assert bare.software.fit is None and bare.software.constants == {}
    assert bare.chip.calibration.hbm_efficiency == 0.85  # chips.yaml
    fitted = load_scenario(TRN1)
    assert fitted.chip.calibration.hbm_efficiency == fitted.software.constants["hbm_efficiency"]
    assert fitted.chip.calibration.hbm_efficiency != 0.85


def test_the_scenarios_own_constants_win_over_the_fit(tmp_path: Path) -> None:
    fitted = load_scenario(P5).software.constants["compute_efficiency"]
    assert load_scenario(P5).chip.calibration.compute_efficiency == fitted
    res = load_scenario(P5, ["cluster.chip.calibration.compute_efficiency=0.95"])
    assert res.chip.calibration.compute_efficiency == 0.95 != fitted
    (tmp_path / "o.yaml").write_text("chips: {h100: {calibration: {compute_efficiency: 0.9}}}\n")
    (tmp_path / "s.yaml").write_text(P5 + "catalog_overlay: o.yaml\n")
    assert load_scenario(tmp_path / "s.yaml").chip.calibration.compute_efficiency == 0.9


def test_a_release_runs_its_bases_fit_and_a_prior_stack_its_priors() -> None:
    core = stack_fit("h100", "megatron-core")
    assert stack_fit("h100", "nemo-24.07").constants == core.constants
    assert stack_fit("h100", "nemo-24.07").fitted_as == "megatron-core"
    bridge = stack_fit("h100", "megatron-bridge-25.11")
    titan = stack_fit("h100", "torchtitan")
    assert titan.fit == bridge.fit and titan.lent == "stack prior megatron-bridge-25.11"
    assert "lent by its stack prior megatron-bridge-25.11" in titan.describe()
    # where its prior has no fit on the family (A100), the family's default stack's
    assert stack_fit("a100", "torchtitan").fit == stack_fit("a100", None).fit
    assert stack_fit("b200", None).lent == "family prior h100"


def test_a_prior_stack_widens_the_interval_by_its_declared_spread() -> None:
    spread = calibration().stacks["torchtitan"].prior_spread
    assert spread is not None
    low0, high0, _ = interval("h100", 1.0, stack="megatron-bridge-25.11")
    low1, high1, basis = interval("h100", 1.0, stack="torchtitan")
    h0, h1 = math.log(high0), math.log(high1)
    assert h1 == pytest.approx(math.hypot(h0, math.log1p(spread)))
    assert low1 < low0 and "megatron-bridge-25.11's fit" in basis


@pytest.mark.parametrize(
    ("stack", "problem"),
    [
        ("megatron-cor", "unknown software stack; did you mean 'megatron-core'?"),
        ("nxd-training", "runs on trainium chips, not on h100"),
    ],
)
def test_a_bad_stack_is_refused_naming_the_key(stack: str, problem: str) -> None:
    with pytest.raises(ScenarioError) as err:
        load_scenario(P5, [f"software.stack={stack}"])
    assert err.value.path == "software.stack" and problem in str(err.value)


def test_run_exits_2_on_an_unknown_stack(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scen = tmp_path / "s.yaml"
    scen.write_text(P5 + "software: {stack: titan}\n")
    assert main(["run", str(scen), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("clustersim: error: software.stack:")
    assert not (tmp_path / "out" / "summary.json").exists()


def test_the_summary_says_which_stack_and_fit(tmp_path: Path) -> None:
    scen = tmp_path / "s.yaml"
    scen.write_text(P5 + "software: {stack: torchtitan}\n")
    assert main(["run", str(scen), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    sw = summary["software"]
    assert sw["stack"] == "torchtitan" and sw["fit"] == "h100/megatron-bridge-25.11"
    assert sw["lent"] == "stack prior megatron-bridge-25.11" and sw["constants"]
    assert "megatron-bridge-25.11's fit" in summary["uncertainty"]["basis"]


def test_catalog_stacks_lists_the_fits_and_their_rows(capsys: pytest.CaptureFixture[str]) -> None:
    lines = stack_lines()
    assert any(line.startswith("megatron-core [default on") for line in lines)
    core = describe_stack("megatron-core")
    fits = core["fits"]
    assert isinstance(fits, dict)
    assert "nemo-llama2-7b" in fits["h100"]["rows"]
    assert main(["catalog", "stacks"]) == 0
    assert "nxd-training [default on trainium]" in capsys.readouterr().out
    assert main(["catalog", "stacks", "torchtitan"]) == 0
    assert "stack prior megatron-bridge-25.11" in capsys.readouterr().out
    assert main(["catalog", "stacks", "nope"]) == 2


@pytest.mark.parametrize("ref", references().training, ids=lambda r: r.name)
def test_a_validation_row_copied_into_a_user_scenario_resolves_identically(
    ref: object, tmp_path: Path
) -> None:
    """The row's scenario file is a plain scenario: copied anywhere, it resolves to the same
    chip constants, cluster, model and stack as validate runs it (the simulation is
    deterministic in the resolved scenario, so the step time is the same)."""
    from clustersim.validation.rows import TrainingRef

    assert isinstance(ref, TrainingRef)
    copy = tmp_path / "mine.yaml"
    copy.write_text(scenario_text(ref))
    mine, theirs = load_scenario(copy), load_scenario(scenario_text(ref))
    assert mine.chip == theirs.chip and mine.instance == theirs.instance
    assert mine.model == theirs.model and mine.scenario == theirs.scenario
    assert mine.software == theirs.software
    assert mine.software.stack == reference_stacks()[ref.name]
    assert mine.software.constants == fit_overrides(mine.chip.name, mine.software.stack or "")


def _copied_step(ref_name: str, tmp_path: Path) -> tuple[float, float]:
    ref = next(r for r in references().training if r.name == ref_name)
    copy = tmp_path / "mine.yaml"
    copy.write_text(scenario_text(ref))
    out = tmp_path / "out"
    assert main(["run", str(copy), "--out", str(out), "--quiet"]) == 0
    mine = json.loads((out / "summary.json").read_text())["step_time_s"]
    return mine, run_training(ref).predicted


@pytest.mark.parametrize("name", ["megatron-1.7b", "trn1-llama2-7b", "nemo-llama2-7b"])
def test_a_copied_row_gives_validates_step_time_to_the_last_digit(
    name: str, tmp_path: Path
) -> None:
    mine, theirs = _copied_step(name, tmp_path)
    assert mine == theirs


@pytest.mark.slow
@pytest.mark.parametrize("ref", references().training, ids=lambda r: r.name)
def test_every_copied_row_gives_validates_step_time(ref: object, tmp_path: Path) -> None:
    from clustersim.validation.rows import TrainingRef

    assert isinstance(ref, TrainingRef)
    res = load_scenario(scenario_text(ref))
    mine = simulate(res, record=True).summary["step_time_s"]
    assert mine == run_training(ref).predicted
