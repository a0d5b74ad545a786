"""Output that survives a pipe: every data-printing command's stdout, read back by its
parser (YAML, strict JSON, one name a line), and tables as wide as their content.

The commands run in-process with stdout captured, which is not a terminal, as a
pipe is not; one case runs ``python -m clustersim`` through a real pipe with a
narrow ``COLUMNS``, so the terminal's width is shown not to matter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from scenario_texts import TINY

from clustersim import catalog
from clustersim.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _strict_json(text: str) -> Any:
    """JSON as any parser reads it: NaN and Infinity are not JSON."""

    def refuse(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def _out(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 0
    return capsys.readouterr().out


def test_catalog_lists_parse_one_name_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    from clustersim.catalog.stacks import stack_names

    overview = _out(capsys, ["catalog"])
    listed = dict(line.split(": ", 1) for line in overview.splitlines())
    assert {k: v.split(", ") for k, v in listed.items()} == {
        **{kind: catalog.names(kind) for kind in catalog.KINDS},
        "stacks": stack_names(),
    }
    for kind in catalog.KINDS:
        assert _out(capsys, ["catalog", kind]).splitlines() == catalog.names(kind)


@pytest.mark.parametrize("kind", catalog.KINDS)
def test_every_catalog_entry_prints_as_yaml_that_loads(
    kind: catalog.Kind, capsys: pytest.CaptureFixture[str]
) -> None:
    loader = {"chips": catalog.chip, "instances": catalog.instance, "models": catalog.model}
    for name in catalog.names(kind):
        text = _out(capsys, ["catalog", kind, name])
        expected = loader[kind](name, None, "test").model_dump(mode="json")
        assert yaml.safe_load(text) == expected, name


def test_a_catalog_entry_through_a_real_pipe_on_a_narrow_terminal() -> None:
    env = {**os.environ, "COLUMNS": "40", "TERM": "xterm-256color"}
    proc = subprocess.run(
        [sys.executable, "-m", "clustersim", "catalog", "instances", "p5.48xlarge"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    data = yaml.safe_load(proc.stdout)
    assert data == catalog.instance("p5.48xlarge", None, "test").model_dump(mode="json")
    assert max(len(line) for line in proc.stdout.splitlines()) > 80  # nothing folded
    assert "\x1b[" not in proc.stdout  # no colour codes in a pipe


def test_schema_is_json(capsys: pytest.CaptureFixture[str]) -> None:
    schema = _strict_json(_out(capsys, ["schema"]))
    assert "cluster" in schema["properties"]


def test_run_json_is_the_summary(
    tiny_yaml: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o"
    printed = _strict_json(_out(capsys, ["run", str(tiny_yaml), "--out", str(out), "--json"]))
    assert printed == _strict_json((out / "summary.json").read_text())


def _body_rows(text: str) -> list[list[str]]:
    """The cells of each body row of a rich table (rows drawn with │)."""
    rows = []
    for line in text.splitlines():
        if line.startswith("│"):
            rows.append([cell.strip() for cell in line.strip("│").split("│")])
    return rows


def test_run_table_is_not_wrapped(
    tiny_yaml: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", str(tiny_yaml), "--out", str(tmp_path / "a-long-output-directory-name")]
    text = _out(capsys, [*argv, "--no-report"])
    rows = _body_rows(text)
    assert len(rows) >= 10
    assert all(row[0] for row in rows), "a row wrapped into a second line"
    model = next(row for row in rows if row[0] == "model")
    assert model[2].endswith("recompute selective")
    memory = next(row for row in rows if row[0] == "memory per chip")
    assert "activations" in memory[2]


def test_collective_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["collective", "--instance", "trn2.48xlarge", "--min", "1KiB", "--max", "1MiB"]
    rows = _strict_json(_out(capsys, [*argv, "--json"]))
    assert [r["size_bytes"] for r in rows] == [2**k for k in range(10, 21)]
    table = _body_rows(_out(capsys, argv))
    assert len(table) == len(rows)


def test_reliability_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "rel.yaml"
    scenario.write_text(TINY + "failures: {preset: rsc1}\n")
    argv = ["reliability", str(scenario), "--step-time", "1s", "--seeds", "2", "--workers", "1"]
    result = _strict_json(_out(capsys, [*argv, "--json"]))
    assert 0 < result["goodput"] <= 1


def test_search_json(tiny_yaml: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["search", str(tiny_yaml), "--chips", "16", "--simulate", "0"]
    meta = _strict_json(_out(capsys, [*argv, "--out", str(tmp_path / "s"), "--json"]))
    assert meta["simulated"] == 0 and meta["top"]


def test_validate_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["validate", "--only", "ring-all-reduce-h100", "daly-interval-24h", "--json"]
    rows = _strict_json(_out(capsys, argv))
    assert len(rows["rows"] if isinstance(rows, dict) else rows) == 2


def test_sweep_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tiny.yaml").write_text(TINY)
    study = tmp_path / "study.yaml"
    study.write_text("name: pipe\nbase: tiny.yaml\naxes:\n  - grid: {parallelism.tp: [2, 4]}\n")
    argv = ["sweep", str(study), "--out", str(tmp_path / "o"), "--workers", "1", "--json"]
    outcome = _strict_json(_out(capsys, argv))
    assert outcome["points"] == 2
