"""The ``moe`` section of a scenario: how the router spreads tokens over the experts.

Only models with ``moe`` in their shape read it (``clustersim.workload.moe``).
"""

from __future__ import annotations

from typing import Literal

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
    - ``dispatcher``: ``flat`` sends every expert copy of a token over the EP
      group's all-to-all; ``hierarchical`` (DeepSeek-V3's, DeepEP's) sends each
      token once to each node holding one of its experts, to the rank at the same
      place there, which forwards it inside the node (the combine reduces inside
      the node first). It differs from ``flat`` only when the EP group spans nodes.
    - ``max_nodes_per_token``: node-limited routing, each token's experts on at most
      this many nodes (DeepSeek-V3: 4); absent takes the model's
      ``moe.max_nodes_per_token``, 0 means no limit. It bounds the nodes the
      hierarchical dispatcher sends a token to.
    """

    balanced: bool = False
    """Forced-balanced routing: every expert gets the same tokens (`skew` is ignored)."""
    skew: float = Field(default=0.0, ge=0, le=10, allow_inf_nan=False)
    """Zipf exponent of expert popularity (0: uniform); which experts are popular is drawn from
    `seed`."""
    capacity_factor: float | None = Field(default=None, gt=0, le=1e6, allow_inf_nan=False)
    """Each expert takes at most this times its balanced share and drops the rest; absent:
    dropless."""
    dispatcher: Literal["flat", "hierarchical"] = "flat"
    """`flat` sends every expert copy of a token over the EP all-to-all; `hierarchical` sends it
    once to each node, which forwards it inside."""
    max_nodes_per_token: int | None = Field(default=None, ge=0, le=1_000_000)
    """Node-limited routing: a token's experts on at most this many nodes (0: no limit); absent:
    the model's."""
