"""Result directories of the tiny scenario, simulated once per session for the report tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from scenario_texts import TINY

from clustersim.cli import main


def _tiny_yaml() -> str:
    return TINY


def simulate_into(root: Path, name: str, *sets: str, extra: Sequence[str] = ()) -> Path:
    scenario = root / f"{name}.yaml"
    scenario.write_text(_tiny_yaml())
    out = root / name
    args = ["run", str(scenario), "--out", str(out), "--quiet", *extra]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    return out


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete result directory: summary, trace, trace.json, figures, report.html."""
    return simulate_into(tmp_path_factory.mktemp("runs"), "tiny")


@pytest.fixture(scope="session")
def tiny_run_tp2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second layout of the tiny model, for comparison reports (summary and trace only)."""
    return simulate_into(
        tmp_path_factory.mktemp("runs"), "tiny_tp2", "parallelism.tp=2", extra=["--no-report"]
    )


@pytest.fixture(scope="session")
def comparison(
    tiny_run: Path, tiny_run_tp2: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """``clustersim report A B``: a comparison report, in the default reports/comparison/."""
    cwd = tmp_path_factory.mktemp("cwd")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        assert main(["report", str(tiny_run), str(tiny_run_tp2)]) == 0
    return cwd / "reports" / "comparison"


@pytest.fixture(scope="session")
def simulate_tiny() -> Callable[..., Path]:
    """``simulate_tiny(root, name, *sets, extra=[...])``: run the tiny scenario into root/name."""
    return simulate_into
