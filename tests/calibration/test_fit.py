"""Fits recover known constants, never read hold-outs, and land in loadable overlays."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from clustersim import validation
from clustersim.calibration import fit as fitmod
from clustersim.calibration.fit import FitRow, estimate_s, fit_group, with_constants
from clustersim.calibration.measurements import CollectivePoint, parse_nccl_tests, parse_nccom_test
from clustersim.calibration.user import _predict, fit_collectives
from clustersim.catalog.fits import ConstantSpec, Family, calibration
from clustersim.catalog.schema import ChipSpec
from clustersim.cli import main
from clustersim.scenario import load_scenario
from clustersim.validation.rows import References, references
from clustersim.validation.training import reference_stacks, scenario_text

from .samples import nccl_tests, nccom_test

A100_ROWS = ["megatron-1.7b", "megatron-3.6b", "megatron-7.5b", "megatron-39.1b"]


def _two_constant_family() -> Family:
    """The A100 family fitting two constants, as a family may: the stack's
    ``compute_efficiency`` and the HBM streaming rate."""
    fam = calibration().families["a100"]
    return fam.model_copy(
        update={
            "constants": {
                "compute_efficiency": fam.constants["compute_efficiency"],
                "hbm_efficiency": ConstantSpec(bounds=(0.4, 0.95), what="HBM streaming"),
            }
        }
    )


def _rows(names: list[str], truth: dict[str, float]) -> list[FitRow]:
    """Rows whose measured steps are the estimate under the ``truth`` constants."""
    refs = {r.name: r for r in references().training}
    out = []
    for name in names:
        res = load_scenario(scenario_text(refs[name]), stack_fit=False)
        out.append(FitRow(name, res, estimate_s(res, with_constants(res.chip, truth))))
    return out


def test_fit_recovers_known_constants() -> None:
    truth = {"compute_efficiency": 0.82, "hbm_efficiency": 0.74}
    family = _two_constant_family()
    result = fit_group("a100/synthetic", _rows(A100_ROWS, truth), family)
    assert set(result.constants) == set(truth)  # 4 rows: two rows per constant
    for name, value in truth.items():
        assert result.constants[name] == pytest.approx(value, rel=1e-3)
    assert result.rms < 1e-4
    assert result.previous == {"compute_efficiency": 1.0, "hbm_efficiency": 0.90}


def test_fewer_rows_fit_fewer_constants() -> None:
    family = _two_constant_family()
    truth = {"compute_efficiency": 0.8}
    two = fit_group("a100/two", _rows(A100_ROWS[:2], truth), family)
    assert list(two.constants) == ["compute_efficiency"]  # one constant per two rows
    assert two.constants["compute_efficiency"] == pytest.approx(0.8, rel=1e-3)
    one = fit_group("a100/one", _rows(A100_ROWS[:1], truth), family)
    assert one.constants == {}  # a row alone sets nothing


def test_leave_one_out_of_a_one_constant_fit_is_the_closed_form() -> None:
    """A step log-linear in one constant, est_i = a_i c^-b_i, makes the fit least squares
    linear in log c with x_i = -b_i: the left-out residual is r_i / (1 - h_ii)."""
    from clustersim.calibration.fit import leave_one_out

    one = calibration().families["a100"]
    assert list(one.constants) == ["compute_efficiency"]
    a = {"megatron-1.7b": 3.0, "megatron-3.6b": 4.0, "megatron-7.5b": 7.0, "megatron-39.1b": 11.0}
    b = {"megatron-1.7b": 0.6, "megatron-3.6b": 1.0, "megatron-7.5b": 1.3, "megatron-39.1b": 0.8}
    noise = {
        "megatron-1.7b": 0.03,
        "megatron-3.6b": -0.02,
        "megatron-7.5b": 0.01,
        "megatron-39.1b": -0.04,
    }

    def estimate(res: object, chip: ChipSpec) -> float:
        name = res.scenario.name  # type: ignore[attr-defined]
        return a[name] * chip.calibration.compute_efficiency ** -b[name]

    rows = [
        FitRow(r.name, r.res, a[r.name] * 0.85 ** -b[r.name] * math.exp(noise[r.name]))
        for r in _rows(A100_ROWS, {})
    ]
    result = fit_group("a100/one", rows, one, estimate=estimate)
    assert list(result.constants) == ["compute_efficiency"]
    loo = leave_one_out(result, rows, one, estimate=estimate)
    sxx = sum(v * v for v in b.values())
    for name, r in result.residuals.items():
        assert loo[name] == pytest.approx(r / (1 - b[name] ** 2 / sxx), rel=1e-5, abs=1e-9)
    assert result.loo == loo
    # larger than in sample, every one: each row helped fit the constant it is judged by
    assert all(abs(loo[n]) > abs(r) for n, r in result.residuals.items())


def test_bounds_hold() -> None:
    family = calibration().families["a100"]
    result = fit_group("a100/slow", _rows(A100_ROWS, {"compute_efficiency": 0.5}), family)
    low, _ = family.constants["compute_efficiency"].bounds
    assert result.constants["compute_efficiency"] >= low


def test_perturbing_a_holdout_does_not_move_the_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    base = {r.key: r.constants for r in fitmod.fit_references()}
    refs = references()
    hold = next(r for r in refs.training if r.role == "holdout" and r.name.startswith("megatron"))
    pub = hold.published.model_copy(update={"tflops_per_gpu": 2 * hold.published.tflops_per_gpu})
    changed = tuple(
        r.model_copy(update={"published": pub}) if r is hold else r for r in refs.training
    )
    fake = References(training=changed, collectives=refs.collectives)
    monkeypatch.setattr(validation.rows, "references", lambda: fake)
    assert {r.key: r.constants for r in fitmod.fit_references()} == base
    # and a calibration row does move it
    cal_row = next(
        r for r in refs.training if r.role == "calibration" and r.name.startswith("megatron")
    )
    pub = cal_row.published.model_copy(
        update={"tflops_per_gpu": 0.8 * cal_row.published.tflops_per_gpu}
    )
    moved = tuple(
        r.model_copy(update={"published": pub}) if r is cal_row else r for r in refs.training
    )
    monkeypatch.setattr(
        validation.rows,
        "references",
        lambda: References(training=moved, collectives=refs.collectives),
    )
    assert {r.key: r.constants for r in fitmod.fit_references()} != base


def _truth_time(
    instance: str, count: int, eff: float, lat: float, ranks: int
) -> Callable[[int], float]:
    """The model's all-reduce time under known constants, for writing sample tables."""
    key = "efa.latency_s" if count > 1 else "fabric.link_latency_s"

    def time_s(n: int) -> float:
        point = CollectivePoint("all_reduce", float(n), 1.0, 0.0, ranks, "", 0)
        return _predict(point, instance, count, eff, lat, key=key)

    return time_s


def test_collective_fit_recovers_link_efficiency_and_latency() -> None:
    time_s = _truth_time("p5.48xlarge", 1, 0.71, 6e-6, 8)
    points = parse_nccl_tests(nccl_tests(time_s), "all_reduce.txt")
    fit = fit_collectives(points, "p5.48xlarge", 1)
    assert fit.link_efficiency == pytest.approx(0.71, rel=1e-2)
    assert fit.latency_s == pytest.approx(6e-6, rel=5e-2)
    assert fit.latency_key == "fabric.link_latency_s"


def test_nccom_fit_across_instances() -> None:
    time_s = _truth_time("trn1.32xlarge", 2, 0.6, 30e-6, 64)
    points = parse_nccom_test(nccom_test(time_s, ranks=64), "allr.txt")
    fit = fit_collectives(points, "trn1.32xlarge", 2)
    assert fit.latency_key == "efa.latency_s"
    assert fit.link_efficiency == pytest.approx(0.6, rel=2e-2)
    assert fit.rms < 1e-3


def test_overlay_from_measurements_loads_in_a_scenario(tmp_path: Path) -> None:
    time_s = _truth_time("p5.48xlarge", 1, 0.7, 5e-6, 8)
    (tmp_path / "all_reduce_perf.txt").write_text(nccl_tests(time_s))
    scen = tmp_path / "s.yaml"
    scen.write_text(
        "name: s\ncluster: {instance: p5.48xlarge, count: 1}\nmodel: {name: llama3-8b, layers: 2}\n"
        "parallelism: {tp: 8}\ntraining: {seq_len: 2048, global_batch_size: 8}\n"
    )
    measured = 1.1 * estimate_s(load_scenario(scen))
    (tmp_path / "steps.csv").write_text(f"scenario,step_time_s\ns.yaml,{measured}\n")
    out = tmp_path / "my-cluster.yaml"
    nccl = str(tmp_path / "all_reduce_perf.txt")
    args = ["calibrate", "--instance", "p5.48xlarge", "--nccl-tests", nccl,
            "--step-times", str(tmp_path / "steps.csv"), "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    overlay = yaml.safe_load(out.read_text())
    assert overlay["chips"]["h100"]["calibration"]["link_efficiency"] == pytest.approx(
        0.7, rel=1e-2
    )
    assert overlay["fit"]["step_times"]["rows"] == [str(tmp_path / "s.yaml")]
    scen2 = tmp_path / "t.yaml"
    scen2.write_text(scen.read_text() + "catalog_overlay: my-cluster.yaml\n")
    res = load_scenario(scen2)
    assert res.chip.calibration.link_efficiency == pytest.approx(0.7, rel=1e-2)
    assert res.instance.fabric.link_latency_s == pytest.approx(5e-6, rel=5e-2)


def test_bad_overlay_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "o.yaml").write_text("chips: {h100: {calibration: {tensor_efficiency: 2}}}\n")
    scen = tmp_path / "s.yaml"
    scen.write_text(
        "name: s\ncluster: {instance: p5.48xlarge, count: 1}\nmodel: llama3-8b\n"
        "training: {seq_len: 2048, global_batch_size: 8}\ncatalog_overlay: o.yaml\n"
    )
    assert main(["check", str(scen)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "catalog_overlay.chips.h100" in err


def test_check_fails_when_shipped_constants_differ(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from clustersim.calibration import command

    def trainium(cal: object = None) -> dict[str, list[FitRow]]:  # the cheapest group
        return {k: v for k, v in fitmod.group_rows().items() if k.startswith("trainium/")}

    monkeypatch.setattr(command, "group_rows", trainium)
    fresh = command.fit_shipped(simulate=False)
    cal = calibration()
    fits = {r.key: r.as_fit() for r in fresh if r.constants}
    same = cal.model_copy(update={"fits": fits})
    monkeypatch.setattr(command, "calibration", lambda: same)
    assert main(["calibrate", "--check", "--no-simulate"]) == 0
    assert "shipped fits match a fresh fit" in capsys.readouterr().out
    assert all(set(f.loo_residuals) == set(f.rows) for f in fits.values())

    def problems(key: str, **update: dict[str, float]) -> list[str]:
        edited = cal.model_copy(update={"fits": {**fits, key: fits[key].model_copy(update=update)}})
        return command._differences(fresh, edited)

    key = next(iter(fits))
    name = next(iter(fits[key].constants))
    moved = problems(key, constants={**fits[key].constants, name: fits[key].constants[name] * 1.05})
    assert [p for p in moved if p.startswith(f"{key}: {name} shipped")]
    assert math.isfinite(fits[key].rms)
    # the stored left-out residuals are checked too, within their tolerance
    row = next(iter(fits[key].loo_residuals))
    for shift, flagged in ((0.5 * command.LOO_TOLERANCE, False), (2 * command.LOO_TOLERANCE, True)):
        loo = {**fits[key].loo_residuals, row: fits[key].loo_residuals[row] + shift}
        found = problems(key, loo_residuals=loo)
        assert bool(found) == flagged
        assert all(p.startswith(f"{key}: leave-one-out residual of {row} shipped") for p in found)
    assert problems(key, loo_residuals={})  # a fit shipped without them fails


def _validation_file(tmp_path: Path, scale: float = 1.0) -> Path:
    """A validate --json-out file whose calibration rows simulate as the estimate (x scale)."""
    from clustersim.catalog.fits import fit_overrides

    stacks = reference_stacks()
    rows = []
    for group in fitmod.group_rows().values():
        for row in group:
            shipped = fit_overrides(row.res.chip.name, stacks[row.name])
            est = estimate_s(row.res, with_constants(row.res.chip, shipped))
            rows.append({"name": row.name, "kind": "training", "predicted": est * scale,
                         "extra": {"calibration": shipped}})  # fmt: skip
    for name in fitmod.prior_rows():  # rows that run with a prior family's fit, checked too
        ref = next(r for r in references().training if r.name == name)
        res = load_scenario(scenario_text(ref))
        shipped = fit_overrides(res.chip.name, reference_stacks()[ref.name])
        est = estimate_s(res, with_constants(res.chip, shipped))
        rows.append({"name": name, "kind": "training", "predicted": est * scale,
                     "extra": {"calibration": shipped}})  # fmt: skip
    path = tmp_path / "validate.json"
    path.write_text(json.dumps({"rows": rows}))
    return path


def test_check_anchors_on_a_validate_run_without_simulating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Simulated steps equal to the estimate anchor nothing: the bare estimate's fit."""
    from clustersim import sim
    from clustersim.calibration import command

    def no_simulation(*_: object, **__: object) -> None:
        raise AssertionError("a validate run's step times must not be simulated again")

    monkeypatch.setattr(sim, "simulate", no_simulation)
    simulated = command.load_validation(_validation_file(tmp_path))
    anchored = {r.key: r.constants for r in command.fit_shipped(simulated=simulated, loo=False)}
    bare = {r.key: r.constants for r in command.fit_shipped(simulate=False, loo=False)}
    assert anchored.keys() == bare.keys()
    for key, constants in bare.items():
        for name, value in constants.items():
            assert anchored[key][name] == pytest.approx(value, rel=1e-6)
    # a simulator 10% slower everywhere moves the fit
    slower = command.load_validation(_validation_file(tmp_path, scale=1.1))
    moved = {r.key: r.constants for r in command.fit_shipped(simulated=slower, loo=False)}
    assert moved != anchored


def test_validation_file_from_other_constants_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _validation_file(tmp_path)
    data = json.loads(path.read_text())
    data["rows"][0]["extra"]["calibration"] = {"tensor_efficiency": 0.1}
    path.write_text(json.dumps(data))
    assert main(["calibrate", "--check", "--validation", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--validation" in err and data["rows"][0]["name"] in err
    data["rows"] = data["rows"][1:]
    path.write_text(json.dumps(data))
    assert main(["calibrate", "--check", "--validation", str(path)]) == 2
    assert "not --quick" in capsys.readouterr().err
    path.write_text("{")
    assert main(["calibrate", "--check", "--validation", str(path)]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_a_stack_with_a_base_is_fitted_and_run_as_its_base() -> None:
    from clustersim.catalog.fits import fit_overrides, fit_stack

    cal = calibration()
    assert fit_stack("nemo-24.07") == "megatron-core"
    assert fit_stack("megatron-bridge-25.09") == "megatron-bridge-25.11"
    assert fit_stack("megatron-core") == "megatron-core"  # no base: itself
    core = fit_overrides("h100", "megatron-core")
    assert core and fit_overrides("h100", "nemo-24.07") == core
    bridge = fit_overrides("h100", "megatron-bridge-25.11")
    assert bridge and fit_overrides("h100", "megatron-bridge-25.09") == bridge
    assert "b200/megatron-core" not in cal.fits  # b200 runs the base with its prior's fit
    assert fit_overrides("b200", "nemo-24.07") == core
    groups = fitmod.group_rows(cal)
    rows = [r.name for r in groups["h100/megatron-core"]]
    assert "nemo-llama2-7b" in rows and "bridge-llama3-8b-fsdp" not in rows
    assert "bridge-llama3-8b-fsdp" in [r.name for r in groups["h100/megatron-bridge-25.11"]]
    assert not any(key.endswith(("/megatron-bridge-25.09", "/nemo-24.07")) for key in groups)


def test_stacks_refuse_cycles_and_own_fits() -> None:
    from clustersim.catalog.fits import parse_calibration
    from clustersim.errors import CatalogError

    base = calibration().model_dump()
    loop = {n: {"base": b, "why": "x", "what": "x"} for n, b in (("a", "b"), ("b", "a"))}
    cyclic = {**base, "stacks": {**base["stacks"], **loop}}
    with pytest.raises(CatalogError, match="cycle"):
        parse_calibration(cyclic)
    fit = next(iter(base["fits"].values()))
    own = {**base, "fits": {**base["fits"], "h100/megatron-bridge-25.09": fit}}
    with pytest.raises(CatalogError, match="fitted as its base"):
        parse_calibration(own)


def test_constants_not_fitted_keep_the_rows_chip_values() -> None:
    """Two Trainium rows fit attention_efficiency alone (the family's first constant);
    hbm_efficiency, and tensor_efficiency, which the family does not fit (its GEMMs take
    the measured kernel's value), keep the rows' catalog values in every estimate of the
    fit and of its leave-one-out refits."""
    from clustersim.calibration.fit import leave_one_out

    family = calibration().families["trainium"]
    rows = _rows(["trn1-llama2-7b", "t5-llama2-13b"], {"attention_efficiency": 0.4})
    seen: list[tuple[float, float | None, float]] = []

    def estimate(res: object, chip: ChipSpec) -> float:
        cal = chip.calibration
        seen.append((cal.tensor_efficiency, cal.attention_efficiency, cal.hbm_efficiency))
        return estimate_s(res, chip)  # type: ignore[arg-type]

    result = fit_group("trainium/synthetic", rows, family, estimate=estimate)
    leave_one_out(result, rows, family, estimate=estimate)
    assert list(result.constants) == ["attention_efficiency"]
    assert result.constants["attention_efficiency"] == pytest.approx(0.4, rel=1e-3)
    catalog = rows[0].res.chip.calibration
    assert seen and all(
        t == catalog.tensor_efficiency and hbm == catalog.hbm_efficiency for t, _, hbm in seen
    )
