"""The ``moe`` section of a scenario: how the router spreads tokens over the experts.

Only models with ``moe`` in their shape read it (``clustersim.workload.moe``).
"""

from __future__ import annotations

from pydantic import Field

from clustersim.catalog import register_model
from clustersim.catalog.schema import Strict

__all__ = ["MoECfg"]


@register_model
class MoECfg(Strict):
    """Token routing of mixture-of-experts layers.

    - ``balanced``: forced-balanced routing, every expert gets the same tokens
      (what published MoE benchmarks run); ``skew`` is then ignored.
    - ``skew``: Zipf exponent of expert popularity (0 = uniform, the balanced
      load). Which experts are popular is drawn from the scenario's ``seed``;
      the rank holding the busiest experts sets the pace.
    - ``capacity_factor``: each expert takes at most this times its balanced
      share and drops the rest; absent means dropless (the default).
    """

    balanced: bool = False
    skew: float = Field(default=0.0, ge=0, le=10, allow_inf_nan=False)
    capacity_factor: float | None = Field(default=None, gt=0, le=1e6, allow_inf_nan=False)
