"""The hardware comparison: $/M tokens under every pricing mode from one simulation."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from clustersim import catalog
from clustersim.cost import owned_usd_per_hour
from clustersim.scenario.models import CostCfg
from clustersim.search.hardware import claim_table, comparison_frame, main


def _results() -> pd.DataFrame:
    rows = [
        # name, instance, count, chip, chips, tokens/s, kWh per M tokens
        ("h100-chips64-budget", "p5.48xlarge", 8, "h100", 64, 80_000.0, 2.0),
        ("trn2-chips64", "trn2.48xlarge", 4, "trn2", 64, 40_000.0, 1.5),
        ("trn2-budget", "trn2.48xlarge", 12, "trn2", 192, 100_000.0, 1.6),
    ]
    return pd.DataFrame(
        [
            {
                "scenario": n,
                "status": "ok",
                "instance": i,
                "instances": c,
                "chip": chip,
                "chips": chips,
                "tokens_per_s": tps,
                "step_time_s": 1e6 / tps,
                "mfu": 0.5,
                "energy.kwh_per_million_tokens": kwh,
                "energy.power_kw": 10.0,
            }
            for n, i, c, chip, chips, tps, kwh in rows
        ]
    )


def test_every_pricing_mode_by_hand() -> None:
    frame = comparison_frame(_results())
    # The H100 point is in both groups.
    assert sorted(frame["group"]) == ["budget", "budget", "chips64", "chips64"]
    h100 = frame[(frame["group"] == "chips64") & (frame["hardware"] == "h100")].iloc[0]
    p5 = catalog.instance("p5.48xlarge")
    for mode in ("on_demand", "reserved", "capacity_block"):
        hour = 8 * getattr(p5.prices_usd_per_hour, mode)
        assert h100[f"usd_per_million_tokens.{mode}"] == pytest.approx(hour / 3600 / 80_000 * 1e6)
    owned = 8 * owned_usd_per_hour(p5, catalog.chip("h100"), CostCfg(pricing="owned"))
    assert h100["usd_per_million_tokens.owned"] == pytest.approx(owned / 3600 / 80_000 * 1e6)


def test_claim_is_reference_over_hardware_minus_one() -> None:
    frame = comparison_frame(_results())
    claims = claim_table(frame)
    row = claims[(claims["group"] == "chips64") & (claims["hardware"] == "trn2")].iloc[0]
    # On demand: H100 $440.32/h at 80k tok/s, Trn2 $143.04/h at 40k tok/s.
    h100 = 8 * 55.04 / 80_000
    trn2 = 4 * 35.76 / 40_000
    assert row["on_demand"] == pytest.approx(h100 / trn2 - 1)
    assert row["energy"] == pytest.approx(2.0 / 1.5 - 1)
    ref = claims[claims["hardware"] == "h100"]
    assert (ref[["on_demand", "owned"]] == 0).all().all()


def test_main_writes_table_and_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study = tmp_path / "study"
    study.mkdir()
    _results().to_parquet(study / "results.parquet")
    assert main([str(study)]) == 0
    assert (study / "hardware.png").stat().st_size > 10_000
    assert len(pd.read_csv(study / "hardware.csv")) == 4
    assert "price-performance against h100" in capsys.readouterr().out
    assert main([str(tmp_path / "missing")]) == 2
