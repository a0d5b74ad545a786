"""The tiny scenario's trace, simulated once per session for the Chrome trace tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import pytest
from scenario_texts import TINY

from clustersim.scenario import load_scenario
from clustersim.sim import simulate
from clustersim.workload import Layout


def tiny_yaml() -> str:
    return TINY


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
