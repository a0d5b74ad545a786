"""Parsing nccl-tests, nccom-test and step-time files, malformed ones included."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from clustersim.calibration.measurements import (
    op_from_name,
    parse_nccl_tests,
    parse_nccom_test,
    parse_step_times,
)
from clustersim.cli import main
from clustersim.errors import ScenarioError

from .samples import SIZES, nccl_tests, nccom_test


def _t(n: int) -> float:
    return 20e-6 + n / 100e9


def test_nccl_tests_table() -> None:
    points = parse_nccl_tests(nccl_tests(_t), "all_reduce_perf.txt")
    assert [p.size_bytes for p in points] == SIZES
    assert all(p.op == "all_reduce" and p.ranks == 8 for p in points)
    for p in points:  # the out-of-place time, to the 0.01 us the table prints
        assert p.time_s == pytest.approx(_t(int(p.size_bytes)), abs=6e-9)
    assert points[0].line == 16  # the first row's line in the file


def test_nccom_test_table() -> None:
    points = parse_nccom_test(nccom_test(_t), "trn1.txt")
    assert len(points) == len(SIZES)
    assert {p.op for p in points} == {"all_reduce"}  # from the command's verb
    assert {p.ranks for p in points} == {64}
    assert points[-1].time_s == pytest.approx(_t(SIZES[-1]), rel=1e-6)


def test_op_names() -> None:
    assert op_from_name("all_gather_perf.log") == "all_gather"
    assert op_from_name("reducescatter.txt") == "reduce_scatter"
    assert op_from_name("results.txt") is None
    with pytest.raises(ScenarioError, match="cannot tell the collective"):
        parse_nccl_tests(nccl_tests(_t), "results.txt")
    assert parse_nccl_tests(nccl_tests(_t), "results.txt", "all_gather")[0].op == "all_gather"


FIRST = 16  # the line of the first row in the sample


def _insert_row(text: str) -> str:
    lines = text.splitlines()
    return "\n".join([*lines[: FIRST - 1], "   1024   256 float", *lines[FIRST - 1 :]])


@pytest.mark.parametrize(
    ("edit", "line", "problem"),
    [
        (lambda t: t.replace("      -1  ", "      -1  oops", 1), FIRST, "not a number"),
        (_insert_row, FIRST, "fields"),
        (
            lambda t: "\n".join(ln for ln in t.splitlines() if "size" not in ln),
            FIRST - 1,
            "before the header",
        ),
        (lambda t: t.replace("# Out of bounds", "Out of bounds"), FIRST + 11, "row of numbers"),
    ],
    ids=["not-a-number", "short-row", "no-header", "stray-text"],
)
def test_malformed_nccl_tests_name_the_line(
    edit: Callable[[str], str], line: int, problem: str
) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_nccl_tests(edit(nccl_tests(_t)), "all_reduce.txt")
    assert err.value.path == f"all_reduce.txt:{line}"
    assert problem in str(err.value)


def test_malformed_nccom_test_names_the_line() -> None:
    lines = nccom_test(_t).splitlines()
    lines[4] = lines[4].replace("fp32", "fp32 -5", 1)  # a negative count shifts the time column
    with pytest.raises(ScenarioError) as err:
        parse_nccom_test("\n".join(lines), "allr.txt")
    assert err.value.path == "allr.txt:5"


def test_step_times_csv(tmp_path: Path) -> None:
    rows = parse_step_times(
        "scenario,step_time_s\na.yaml,1.5\n# note\nsub/b.yaml,2\n", str(tmp_path / "s.csv")
    )
    assert rows == [(tmp_path / "a.yaml", 1.5), (tmp_path / "sub" / "b.yaml", 2.0)]
    for text, line in (
        ("scenario,time\n", 1),
        ("scenario,step_time_s\na.yaml,-1\n", 2),
        ("scenario,step_time_s\na.yaml\n", 2),
    ):
        with pytest.raises(ScenarioError) as err:
            parse_step_times(text, "s.csv")
        assert err.value.path == f"s.csv:{line}"


def test_cli_malformed_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "all_reduce_perf.txt"
    bad.write_text(nccl_tests(_t).replace("      -1  ", "      -1  oops", 1))
    code = main(
        [
            "calibrate",
            "--instance",
            "p5.48xlarge",
            "--nccl-tests",
            str(bad),
            "--out",
            str(tmp_path / "o.yaml"),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{bad}:{FIRST}" in err
