"""Dollars: instance-hours by pricing mode, and cost per million tokens."""

from __future__ import annotations

from clustersim.catalog.schema import InstanceSpec
from clustersim.errors import ScenarioError
from clustersim.scenario.models import CostCfg

__all__ = ["usd_per_hour", "usd_per_million_tokens"]


def usd_per_hour(instance: InstanceSpec, count: int, cfg: CostCfg) -> float:
    """Price of the whole cluster per hour under the scenario's pricing mode."""
    if cfg.usd_per_instance_hour is not None:
        return cfg.usd_per_instance_hour * count
    price = getattr(instance.prices_usd_per_hour, cfg.pricing)
    if price is None:
        known = [
            mode
            for mode in ("on_demand", "reserved", "capacity_block")
            if getattr(instance.prices_usd_per_hour, mode) is not None
        ]
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
