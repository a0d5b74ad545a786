"""Mixture-of-experts token routing: how many token copies each expert receives, and
the traffic and padded GEMM rows of the EP group's busiest rank.

**Token load.** The tokens one EP group routes per microbatch (ep x T_s, each to
k experts) are spread over the experts by expected counts (no sampling noise):

- ``moe.balanced`` (what published benchmarks force) or ``skew: 0``: N k / E each;
- ``skew: s``: expert popularity follows a Zipf law of exponent s over a seeded
  random order of the experts, and no expert takes more than one copy of each
  token (the excess is spread over the others);
- ``capacity_factor: c``: each expert keeps at most c N k / E and drops the rest
  (no compute, no traffic); absent means dropless.

Local experts are contiguous (rank i of the EP group holds experts i E_l ..
(i+1) E_l - 1, as in Megatron-Core). The stage's program is that of the rank
whose experts receive the most: it receives and computes the most, and every
other rank waits for it at the combine all-to-all, so it sets the pace. The
all-to-alls are lowered as uniform ones whose per-rank buffer is that rank's
receive volume (at least what each rank sends): exact under balanced routing,
and under skew the busiest rank's traffic at the cost of overstating the
others'.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from clustersim.catalog.schema import ModelSpec, MoESpec
from clustersim.scenario.models import MoECfg, ParallelismCfg, TrainingCfg
from clustersim.workload.dims import make_dims
from clustersim.workload.layout import Layout

__all__ = [
    "ROW_TILE",
    "Routing",
    "expert_loads",
    "nodes_per_token",
    "routing",
    "stage_routing",
]

ROW_TILE = 128
"""Token rows a grouped-GEMM kernel computes per tile: each expert's tokens are padded up
to a multiple of it. 128 is the M tile of CUTLASS's and Transformer Engine's grouped
GEMMs on Hopper, and the partition count of a NeuronCore's SBUF (arXiv 2412.19437 pads
DeepSeek-V3's expert GEMMs alike); a modelling choice, not a measured figure."""


def expert_loads(experts: int, top_k: int, tokens: float, skew: float, seed: int) -> np.ndarray:
    """Expected token copies each expert receives when ``tokens`` tokens pick ``top_k`` each.

    Popularity is Zipf with exponent ``skew`` over a random order of the experts
    drawn from ``seed``; no expert takes more than ``tokens`` (one copy of each).
    """
    total = tokens * top_k
    if skew == 0:
        return np.full(experts, total / experts)
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, experts + 1, dtype=np.float64) ** skew
    weights = weights[rng.permutation(experts)]
    loads = np.zeros(experts)
    full = np.zeros(experts, dtype=bool)
    left = total
    # Water-filling: experts over their cap keep it, the rest share what is left.
    for _ in range(experts):
        share = left * np.where(full, 0.0, weights) / weights[~full].sum()
        over = ~full & (share > tokens)
        if not over.any():
            loads[~full] = share[~full]
            break
        full |= over
        loads[over] = tokens
        left = total - loads[full].sum()
    return loads


@dataclass(frozen=True)
class Routing:
    """The representative (busiest) rank's MoE traffic and work, per microbatch and layer.

    ``sent`` and ``received`` are token copies over the EP all-to-all;
    ``expert_rows`` the padded rows of each local expert's GEMM after the expert-TP
    gather (their mean over the local experts); ``kept`` the fraction of routed
    copies not dropped by the capacity factor, over the whole EP group.
    """

    sent: float
    received: float
    expert_rows: int
    local_experts: int
    kept: float = 1.0
    node_tokens: float = 0.0
    """Token copies in the inter-node all-to-all's per-rank buffer under the
    hierarchical dispatcher (one per token and destination node); 0: flat."""

    @property
    def a2a_tokens(self) -> float:
        """Token copies in the uniform all-to-all's per-rank buffer (module doc)."""
        return max(self.sent, self.received)


@functools.lru_cache(maxsize=4096)
def routing(
    moe: MoESpec,
    tokens_per_rank: int,
    layout: Layout,
    cfg: MoECfg | None = None,
    seed: int = 0,
) -> Routing:
    """Token loads of the busiest rank of an EP group (see the module doc).

    Cached: the arguments are frozen, and a search asks again for every zero level,
    recompute and schedule of a shape.
    """
    cfg = cfg if cfg is not None else MoECfg()
    ep, etp, e = layout.ep, layout.etp, moe.experts
    local = e // ep
    n = tokens_per_rank * ep  # tokens the EP group routes
    skew = 0.0 if cfg.balanced else cfg.skew
    loads = expert_loads(e, moe.top_k, n, skew, seed)
    routed = loads.sum()
    if cfg.capacity_factor is not None:
        loads = np.minimum(loads, cfg.capacity_factor * n * moe.top_k / e)
    kept = float(loads.sum() / routed) if routed > 0 else 1.0
    per_rank = loads.reshape(ep, local)
    busiest = int(np.argmax(per_rank.sum(axis=1)))
    mine = per_rank[busiest] * etp  # the expert-TP gather stacks the etp peers' tokens
    padded = np.ceil(mine / ROW_TILE) * ROW_TILE
    rows = math.ceil(float(padded.sum()) / local) if padded.sum() > 0 else 0
    sent, received = float(tokens_per_rank * moe.top_k * kept), float(per_rank[busiest].sum())
    node_tokens = 0.0
    if cfg.dispatcher == "hierarchical" and layout.ep_nodes > 1:
        limit = (
            moe.max_nodes_per_token if cfg.max_nodes_per_token is None else cfg.max_nodes_per_token
        )
        node_tokens = (
            max(sent, received) * nodes_per_token(moe.top_k, layout.ep_nodes, limit) / moe.top_k
        )
    return Routing(
        sent=sent,
        received=received,
        expert_rows=rows,
        local_experts=local,
        kept=kept,
        node_tokens=node_tokens,
    )


def nodes_per_token(top_k: int, nodes: int, limit: int = 0) -> float:
    """Expected distinct nodes holding a token's ``top_k`` experts.

    The experts fall on ``m = min(limit, nodes)`` nodes (all ``nodes`` without a
    limit) evenly at random, so ``m (1 - (1 - 1/m)^k)``: DeepSeek-V3's 8 experts on
    at most 4 of 8 nodes reach 3.6 nodes, 5.25 without the limit.
    """
    m = nodes if limit <= 0 else min(limit, nodes)
    return m * (1.0 - (1.0 - 1.0 / m) ** top_k)


def stage_routing(
    model: ModelSpec,
    par: ParallelismCfg,
    train: TrainingCfg,
    layout: Layout,
    *,
    cfg: MoECfg | None = None,
    seed: int = 0,
) -> Routing:
    """:func:`routing` for the tokens one rank routes per microbatch."""
    assert model.moe is not None  # callers check
    dm = make_dims(model, par, train, layout)
    return routing(model.moe, dm.sp_tokens, layout, cfg, seed)
