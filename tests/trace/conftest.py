"""The tiny scenario's trace, simulated once per session for the Chrome trace tests."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from clustersim.scenario import load_scenario
from clustersim.sim import simulate
from clustersim.workload import Layout


def tiny_yaml() -> str:
    """The tiny scenario of ``tests/conftest.py`` (one source of truth for it)."""
    spec = importlib.util.spec_from_file_location(
        "_tests_conftest", Path(__file__).resolve().parents[1] / "conftest.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.TINY)


@dataclass
class Traced:
    frame: pd.DataFrame
    layout: Layout
    summary: dict[str, Any]


@pytest.fixture(scope="session")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Traced:
    path = tmp_path_factory.mktemp("trace") / "tiny.yaml"
    path.write_text(tiny_yaml())
    result = simulate(load_scenario(path))
    return Traced(result.trace_frame(), result.plan.layout, result.summary)
