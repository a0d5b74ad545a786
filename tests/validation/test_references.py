"""The reference rows: roles follow the stated rule, known gaps name their mechanism."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim.catalog.fits import family_of, fit_stack
from clustersim.errors import ScenarioError
from clustersim.scenario import load_scenario
from clustersim.sim.run import check_precision
from clustersim.validation import mean_training_error, passed, role_errors
from clustersim.validation.rows import Row, TrainingRef, references
from clustersim.validation.training import scenario_text


def _fit_group_and_devices(ref: TrainingRef) -> tuple[str, int]:
    """The row's fit group (its chip's family and the stack its stack is fitted as) and
    its device count."""
    res = load_scenario(scenario_text(ref))
    stack = res.software.stack
    assert stack is not None, ref.name
    family = family_of(res.chip.name) or res.chip.name
    return f"{family}/{fit_stack(stack)}", res.chips


def test_roles_alternate_by_scale_within_each_fit_group() -> None:
    """The rule of references.yaml: sorted by devices (ties in file order), the rows of a
    fit group (chip family and the stack fitted) alternate calibration, holdout, ...
    starting with calibration."""
    by_group: dict[str, list[tuple[int, int, TrainingRef]]] = {}
    for i, ref in enumerate(references().training):
        group, devices = _fit_group_and_devices(ref)
        by_group.setdefault(group, []).append((devices, i, ref))
    assert {"a100/megatron-core", "h100/megatron-core", "trainium/nxd-training"} <= set(by_group)
    for group, rows in by_group.items():
        rows.sort(key=lambda t: (t[0], t[1]))
        want = ["calibration" if j % 2 == 0 else "holdout" for j in range(len(rows))]
        assert [r.role for _, _, r in rows] == want, (group, [r.name for _, _, r in rows])
    holdouts = [r for r in references().training if r.role == "holdout"]
    assert len(holdouts) >= 8


def test_known_gaps_name_their_mechanism() -> None:
    for ref in references().training:
        if ref.status == "known_gap":
            assert len(ref.gap) > 40, ref.name
    with pytest.raises(ValueError, match="gap"):
        TrainingRef.model_validate(
            {**references().training[0].model_dump(), "status": "known_gap", "gap": ""}
        )


def test_a_known_gap_reports_without_failing() -> None:
    gap = Row("g", "training", "step time", "s", 10.0, 7.0, 0.1, "t", role="holdout",
              status="known_gap", gap="a mechanism")  # fmt: skip
    ok = Row("c", "training", "step time", "s", 10.0, 10.2, 0.1, "t", role="calibration")
    assert gap.passed and not gap.within
    assert passed([gap, ok])
    assert mean_training_error([gap, ok]) == pytest.approx(0.02)  # the gap is left out
    stats = role_errors([gap, ok])
    assert stats["known_gap"]["max_abs_error"] == pytest.approx(0.3)
    assert stats["calibration"]["rows"] == 1


@pytest.mark.parametrize("instance", ["dgx-a100", "p4de.24xlarge"])
def test_fp8_is_refused_on_a_chip_without_it(instance: str) -> None:
    text = f"""
name: a100-fp8
cluster: {{instance: {instance}, count: 1}}
model: {{name: llama3-8b, layers: 2}}
parallelism: {{tp: 8}}
training: {{seq_len: 2048, global_batch_size: 8, precision: fp8}}
"""
    res = load_scenario(text)
    with pytest.raises(ScenarioError) as err:
        check_precision(res)
    assert err.value.path == "training.precision"
    assert "no FP8" in str(err.value)


def test_fp8_on_a100_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from clustersim.cli import main

    path = tmp_path / "fp8.yaml"
    path.write_text(
        "name: a100-fp8\ncluster: {instance: dgx-a100, count: 1}\n"
        "model: {name: llama3-8b, layers: 2}\nparallelism: {tp: 8}\n"
        "training: {seq_len: 2048, global_batch_size: 8, precision: fp8}\n"
    )
    assert main(["run", str(path), "--no-report", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "training.precision" in err


def test_holdout_coverage_counts_rows_inside_their_interval() -> None:
    from clustersim.validation.command import holdout_coverage

    inside = Row("a", "training", "step time", "s", 10.0, 10.5, 0.1, "t", role="holdout",
                 extra={"uncertainty": [9.0, 12.0]})  # fmt: skip
    outside = Row("b", "training", "step time", "s", 10.0, 13.0, 0.1, "t", role="holdout",
                  extra={"uncertainty": [11.0, 15.0]})  # fmt: skip
    cal = Row("c", "training", "step time", "s", 10.0, 10.0, 0.1, "t", role="calibration",
              extra={"uncertainty": [11.0, 15.0]})  # fmt: skip
    assert holdout_coverage([inside, outside, cal]) == {"rows": 2, "inside": 1}
    assert holdout_coverage([cal]) is None


def test_serving_references_are_every_published_serving_row_in_its_role() -> None:
    """Every row of serve.references is a serving reference with the row's own role,
    and a known gap names its mechanism."""
    from clustersim.serve.references import ROWS, THROUGHPUT_ROWS

    refs = {r.id: r for r in references().serving}
    assert set(refs) == {row.id for row in (*ROWS, *THROUGHPUT_ROWS)}
    assert all(refs[row.id].role == "holdout" for row in THROUGHPUT_ROWS)
    for row in ROWS:
        role = "calibration" if row.role == "calibration" else "holdout"
        assert refs[row.id].role == role, row.id
    for ref in refs.values():
        assert all(len(text) > 40 for text in ref.gaps.values()), ref.name


def test_serving_rows_check_ttft_and_tpot_on_their_own_tolerances() -> None:
    from clustersim.validation.serving import run_serving_rows

    ref = next(r for r in references().serving if r.id == "S11")
    ttft, tpot = run_serving_rows(ref)
    assert (ttft.name, tpot.name) == (f"{ref.name}@ttft", f"{ref.name}@tpot")
    assert (ttft.tolerance, tpot.tolerance) == (0.25, 0.15)
    assert ttft.published == pytest.approx(0.0963) and tpot.published == pytest.approx(0.01211)
    assert ttft.kind == tpot.kind == "serving" and ttft.passed and tpot.passed
    gap = next(r for r in references().serving if r.id == "S4")
    rows = {r.metric: r for r in run_serving_rows(gap)}
    assert rows["p50 TTFT"].status == "known_gap" and rows["p50 TPOT"].status == "checked"


def test_a_throughput_row_checks_output_tokens_per_second_at_maximum_load() -> None:
    """S10 (trtllm-bench, one H100, Llama-3.1-8B FP8): one row on the throughput
    tolerance, the published figure in tokens per second, every request sent at once."""
    from clustersim.serve.references import THROUGHPUT_ROWS, throughput_scenario_text
    from clustersim.validation.serving import run_serving_rows

    ref = next(r for r in references().serving if r.id == "S10")
    (row,) = run_serving_rows(ref)
    assert row.name == f"{ref.name}@throughput" and row.unit == "tok/s"
    assert row.published == 15220.0 and row.tolerance == 0.15 and row.passed
    spec = next(r for r in THROUGHPUT_ROWS if r.id == "S10")
    assert f"concurrency: {spec.requests}, ramp_s: 0" in throughput_scenario_text(spec)
