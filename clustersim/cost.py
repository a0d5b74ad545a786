"""Dollars and energy: instance-hours by pricing mode, TCO, $/million tokens, kWh.

Pricing modes (``cost.pricing``):

- ``on_demand``, ``reserved``, ``capacity_block``: the instance's catalog rate
  (``prices_usd_per_hour``), per instance-hour;
- ``owned``: a total cost of ownership per instance-hour,

      capex / (amortization_years x 8760) + capex x opex_fraction_per_year / 8760
      + power_kW x pue x usd_per_kwh,

  straight-line amortisation over round-the-clock use, with power = chips x chip
  ``power_w`` + the instance's ``host_power_w`` (the chips at their rated power:
  training keeps them near it).

``cost.usd_per_instance_hour`` overrides the rate in every mode. Each ``owned``
figure the scenario leaves out comes from the instance's catalog ``owned`` entry.

Energy is the facility's: the instances' power times the PUE (the scenario's
``cost.pue``, else the catalog's, else 1) over the step.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.catalog.schema import ChipSpec, InstanceSpec
from clustersim.errors import MISSING, ScenarioError
from clustersim.scenario.models import CostCfg

__all__ = [
    "HOURS_PER_YEAR",
    "PRICING_MODES",
    "OwnedTerms",
    "energy",
    "instance_power_w",
    "owned_terms",
    "owned_usd_per_hour",
    "pue",
    "usd_per_hour",
    "usd_per_million_tokens",
]

HOURS_PER_YEAR = 365.0 * 24.0
PRICING_MODES: tuple[str, ...] = ("on_demand", "reserved", "capacity_block", "owned")
_RENTED = PRICING_MODES[:3]


@dataclass(frozen=True)
class OwnedTerms:
    """The figures of an ``owned`` TCO for one instance, after scenario overrides."""

    capex_usd: float
    amortization_years: float
    pue: float
    usd_per_kwh: float
    opex_fraction_per_year: float


def instance_power_w(instance: InstanceSpec, chip: ChipSpec) -> float:
    """Rated power of one instance: its chips plus its host (CPUs, DRAM, NICs, fans)."""
    return instance.chips * chip.power_w + instance.host_power_w


def owned_terms(instance: InstanceSpec, cfg: CostCfg) -> OwnedTerms:
    """The TCO figures: the scenario's ``cost`` keys over the instance's catalog ``owned``."""
    base = instance.owned
    values: dict[str, float] = {}
    for key, cfg_key in (
        ("capex_usd", "capex_usd_per_instance"),
        ("amortization_years", "amortization_years"),
        ("pue", "pue"),
        ("usd_per_kwh", "usd_per_kwh"),
        ("opex_fraction_per_year", "opex_fraction_per_year"),
    ):
        value = getattr(cfg, cfg_key)
        if value is None and base is not None:
            value = getattr(base, key)
        if value is None:
            raise ScenarioError(
                f"cost.{cfg_key}",
                MISSING,
                f"{instance.name} has no catalog default for pricing: owned; set cost.{cfg_key}",
            )
        values[key] = float(value)
    return OwnedTerms(**values)


def owned_usd_per_hour(instance: InstanceSpec, chip: ChipSpec, cfg: CostCfg) -> float:
    """TCO of one instance per hour of use (see the module docstring)."""
    t = owned_terms(instance, cfg)
    capex_h = t.capex_usd / (t.amortization_years * HOURS_PER_YEAR)
    opex_h = t.capex_usd * t.opex_fraction_per_year / HOURS_PER_YEAR
    power_h = instance_power_w(instance, chip) / 1000.0 * t.pue * t.usd_per_kwh
    return capex_h + opex_h + power_h


def usd_per_hour(
    instance: InstanceSpec, count: int, cfg: CostCfg, chip: ChipSpec | None = None
) -> float:
    """Price of the whole cluster per hour under the scenario's pricing mode.

    ``chip`` (the instance's chip, with scenario overrides) is needed for ``owned``,
    whose power cost depends on it.
    """
    if cfg.usd_per_instance_hour is not None:
        return cfg.usd_per_instance_hour * count
    if cfg.pricing == "owned":
        if chip is None:
            raise ValueError("pricing: owned needs the chip, for its power")
        return owned_usd_per_hour(instance, chip, cfg) * count
    price = getattr(instance.prices_usd_per_hour, cfg.pricing)
    if price is None:
        known = [m for m in _RENTED if getattr(instance.prices_usd_per_hour, m) is not None]
        if instance.owned is not None:
            known.append("owned")
        raise ScenarioError(
            "cost.pricing",
            cfg.pricing,
            f"no {cfg.pricing} price for {instance.name}; available: {', '.join(known)}, "
            "or set cost.usd_per_instance_hour",
        )
    return float(price) * count


def usd_per_million_tokens(usd_hour: float, tokens_per_s: float) -> float:
    if tokens_per_s <= 0:
        return float("inf")
    return usd_hour / 3600.0 / tokens_per_s * 1e6


def pue(instance: InstanceSpec, cfg: CostCfg) -> float:
    """Power usage effectiveness: the scenario's, else the catalog's ``owned.pue``, else 1."""
    if cfg.pue is not None:
        return cfg.pue
    if instance.owned is not None:
        return instance.owned.pue
    return 1.0


def energy(
    instance: InstanceSpec,
    chip: ChipSpec,
    count: int,
    cfg: CostCfg,
    *,
    step_time_s: float,
    tokens_per_step: float,
) -> dict[str, float]:
    """Facility energy of a step: rated IT power x PUE x step time.

    ``power_kw`` is the instances' rated IT power (chips and hosts); the kWh
    figures include the PUE.
    """
    it_kw = instance_power_w(instance, chip) * count / 1000.0
    factor = pue(instance, cfg)
    kwh_step = it_kw * factor * step_time_s / 3600.0
    per_m = kwh_step / tokens_per_step * 1e6 if tokens_per_step > 0 else float("inf")
    return {
        "power_kw": it_kw,
        "pue": factor,
        "kwh_per_step": kwh_step,
        "kwh_per_million_tokens": per_m,
    }
