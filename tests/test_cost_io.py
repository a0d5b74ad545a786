"""Cost arithmetic and atomic writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim import catalog
from clustersim.cost import usd_per_hour, usd_per_million_tokens
from clustersim.errors import ScenarioError
from clustersim.scenario.models import CostCfg
from clustersim.trace.io import atomic_write, atomic_write_text


def test_usd_per_hour_modes() -> None:
    trn1 = catalog.instance("trn1.32xlarge")
    assert usd_per_hour(trn1, 16, CostCfg()) == pytest.approx(16 * 21.50)
    assert usd_per_hour(trn1, 2, CostCfg(pricing="reserved")) == pytest.approx(2 * 8.197)
    assert usd_per_hour(trn1, 3, CostCfg(usd_per_instance_hour=10.0)) == 30.0
    no_block = trn1.model_copy(
        update={
            "prices_usd_per_hour": trn1.prices_usd_per_hour.model_copy(
                update={"capacity_block": None}
            )
        }
    )
    with pytest.raises(ScenarioError, match=r"cost\.pricing"):
        usd_per_hour(no_block, 1, CostCfg(pricing="capacity_block"))


def test_usd_per_million_tokens() -> None:
    # $36/h at 10,000 tokens/s: 36 million tokens per hour cost $36, so $1 per million.
    assert usd_per_million_tokens(36.0, 10_000.0) == pytest.approx(1.0)
    assert usd_per_million_tokens(36.0, 0.0) == float("inf")


def test_atomic_write_replaces_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "summary.json"
    atomic_write_text(target, "old")
    atomic_write_text(target, "new")
    assert target.read_text() == "new"
    assert [p.name for p in target.parent.iterdir()] == ["summary.json"]
    assert target.stat().st_mode & 0o044  # readable by others under the usual umask


def test_atomic_write_failure_leaves_old_file(tmp_path: Path) -> None:
    target = tmp_path / "trace.parquet"
    atomic_write_text(target, "complete")

    def fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        atomic_write(target, fail)
    assert target.read_text() == "complete"
    assert [p.name for p in tmp_path.iterdir()] == ["trace.parquet"]
