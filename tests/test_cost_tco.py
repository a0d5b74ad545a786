"""Pricing modes, the owned TCO and energy per token, against hand calculations."""

from __future__ import annotations

from pathlib import Path

import pytest

from clustersim import catalog
from clustersim.cli import main
from clustersim.cost import (
    HOURS_PER_YEAR,
    energy,
    instance_power_w,
    owned_terms,
    owned_usd_per_hour,
    usd_per_hour,
    usd_per_million_tokens,
)
from clustersim.errors import ScenarioError
from clustersim.scenario import load_scenario
from clustersim.scenario.models import CostCfg
from clustersim.sim import simulate

# The six hardware generations of the comparison study, with the on-demand rates
# REFERENCES gives for them.
ON_DEMAND = {
    "trn1.32xlarge": 21.50,
    "trn2.48xlarge": 35.76,
    "p5.48xlarge": 55.04,
    "p5en.48xlarge": 63.296,
    "p6-b200.48xlarge": 113.93,
}


@pytest.mark.parametrize(("name", "rate"), sorted(ON_DEMAND.items()))
def test_catalog_rates_and_every_pricing_mode(name: str, rate: float) -> None:
    inst = catalog.instance(name)
    assert inst.prices_usd_per_hour.on_demand == pytest.approx(rate)
    for mode in ("on_demand", "reserved", "capacity_block"):
        price = getattr(inst.prices_usd_per_hour, mode)
        assert price is not None and 0 < price <= rate
        assert usd_per_hour(inst, 3, CostCfg(pricing=mode)) == pytest.approx(3 * price)
    assert inst.owned is not None


def test_trn1_reserved_is_the_published_ri_price() -> None:
    inst = catalog.instance("trn1.32xlarge")
    assert usd_per_hour(inst, 2, CostCfg(pricing="reserved")) == pytest.approx(2 * 8.197)


def test_power_per_instance() -> None:
    # 16 Trn2 chips at about 500 W plus a 1.5 kW host; 8 H100 at 700 W plus 1.5 kW.
    trn2 = catalog.instance("trn2.48xlarge")
    assert instance_power_w(trn2, catalog.chip("trn2")) == pytest.approx(16 * 500 + 1500)
    p5 = catalog.instance("p5.48xlarge")
    assert instance_power_w(p5, catalog.chip("h100")) == pytest.approx(8 * 700 + 1500)
    for chip, watts in (("trn3", 1000), ("h200", 700), ("b200", 1000), ("a100", 400)):
        assert catalog.chip(chip).power_w == watts


def test_owned_tco_by_hand() -> None:
    inst = catalog.instance("p5.48xlarge")
    chip = catalog.chip("h100")
    cfg = CostCfg(
        pricing="owned",
        capex_usd_per_instance=300_000,
        amortization_years=5,
        pue=1.25,
        usd_per_kwh=0.10,
        opex_fraction_per_year=0.1,
    )
    # 300,000 over 5 years of 8,760 h = 6.849 $/h; opex 30,000 a year = 3.425 $/h;
    # 7.1 kW x 1.25 x 0.10 $/kWh = 0.8875 $/h.
    capex_h = 300_000 / (5 * 8760)
    opex_h = 300_000 * 0.1 / 8760
    power_h = 7.1 * 1.25 * 0.10
    assert HOURS_PER_YEAR == 8760
    assert owned_usd_per_hour(inst, chip, cfg) == pytest.approx(capex_h + opex_h + power_h)
    assert usd_per_hour(inst, 4, cfg, chip) == pytest.approx(4 * (capex_h + opex_h + power_h))
    assert usd_per_hour(inst, 4, cfg, chip) == pytest.approx(4 * 11.1613, rel=1e-4)


def test_owned_takes_catalog_defaults_for_keys_left_out() -> None:
    inst = catalog.instance("trn2.48xlarge")
    assert inst.owned is not None
    terms = owned_terms(inst, CostCfg(pricing="owned", usd_per_kwh=0.2))
    assert terms.usd_per_kwh == 0.2
    assert terms.capex_usd == inst.owned.capex_usd
    assert terms.amortization_years == inst.owned.amortization_years
    assert terms.pue == inst.owned.pue


def test_owned_without_defaults_names_the_missing_key() -> None:
    inst = catalog.instance("trn2.48xlarge").model_copy(update={"owned": None})
    with pytest.raises(ScenarioError, match=r"cost\.capex_usd_per_instance"):
        usd_per_hour(inst, 1, CostCfg(pricing="owned"), catalog.chip("trn2"))


def test_energy_per_token_by_hand() -> None:
    inst = catalog.instance("trn2.48xlarge")
    chip = catalog.chip("trn2")
    e = energy(inst, chip, 2, CostCfg(pue=1.1), step_time_s=3.6, tokens_per_step=1_000_000)
    # 2 x 9.5 kW = 19 kW of IT power; x 1.1 PUE x 1 ms of an hour = 0.0209 kWh per step.
    assert e["power_kw"] == pytest.approx(19.0)
    assert e["pue"] == 1.1
    assert e["kwh_per_step"] == pytest.approx(19.0 * 1.1 * 3.6 / 3600)
    assert e["kwh_per_million_tokens"] == pytest.approx(0.0209)


def test_summary_has_energy_and_owned_cost(tiny_yaml: Path) -> None:
    res = load_scenario(tiny_yaml, ["cost.pricing=owned", "cost.usd_per_kwh=0.1"])
    s = simulate(res, record=False).summary
    hour = owned_usd_per_hour(res.instance, res.chip, res.scenario.cost)
    assert s["cost"]["pricing"] == "owned"
    assert s["cost"]["usd_per_hour"] == pytest.approx(hour)
    assert s["cost"]["usd_per_million_tokens"] == pytest.approx(
        usd_per_million_tokens(hour, s["tokens_per_s"])
    )
    kwh = (16 * 500 + 1500) / 1000 * 1.2 * s["step_time_s"] / 3600
    assert s["energy"]["kwh_per_step"] == pytest.approx(kwh)
    assert s["energy"]["kwh_per_million_tokens"] == pytest.approx(kwh / s["tokens_per_step"] * 1e6)


def test_cli_rejects_unknown_pricing(tiny_yaml: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(tiny_yaml), "--set", "cost.pricing=leased"]) == 2
    err = capsys.readouterr().err
    assert "cost.pricing" in err and "Traceback" not in err
