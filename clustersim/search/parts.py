"""The estimate's result, and the per-microbatch block times it builds a layout's from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from clustersim.search.beside import Pair
from clustersim.search.buckets import Ready
from clustersim.workload.sharding import EMBED_UNIT, HEAD_UNIT

__all__ = ["Blocks", "Estimate", "blocks_times"]


@dataclass(frozen=True)
class Estimate:
    """The estimated step and its parts in seconds, the parts averaged over the stages
    as ``summary.json``'s breakdown averages over ranks."""

    step_time_s: float
    compute_s: float
    comm_s: float  # TP and CP collectives inside the layers, and pipeline hops
    bubble_s: float
    dp_exposed_s: float
    optimizer_s: float
    mfu: float
    interference_s: float = 0.0  # compute slowed by the SMs overlapped collectives take


@dataclass(frozen=True)
class Blocks:
    """Per-microbatch (compute, communication) seconds of a dense and an MoE layer (the
    dense one's for dense models), the embedding and the head."""

    layer_fwd: tuple[float, float]
    layer_bwd: tuple[float, float]  # backward plus recompute, one after the other
    moe_fwd: tuple[float, float]
    moe_bwd: tuple[float, float]
    embed_fwd: tuple[float, float]
    embed_bwd: tuple[float, float]
    head_fwd: tuple[float, float]
    head_bwd: tuple[float, float]
    p2p_bytes: float
    p2p_gather_s: float  # the TP all-gather that rebuilds a scatter-gathered message
    # (start, seconds) of each TP/CP collective in a layer's forward, and in its
    # recompute and backward, from the layer's start
    layer_fwd_comms: tuple[tuple[float, float], ...] = ()
    layer_bwd_comms: tuple[tuple[float, float], ...] = ()
    # a dense layer the FP8 recipe keeps in BF16 (training.fp8.bf16_layers)
    bf16_fwd: tuple[float, float] = (0.0, 0.0)
    bf16_bwd: tuple[float, float] = (0.0, 0.0)
    # when each block's gradient pieces are ready in its backward (``search.buckets``)
    ready: Mapping[str, Ready] = field(default_factory=dict)
    # a (backward, recompute) pair of block kinds run beside each other
    # (``search.beside``); empty where the recompute does not run beside
    beside: Mapping[tuple[str, str], Pair] = field(default_factory=dict)
    # the ops (instructions) a microbatch runs of each unit ("dense", "moe", "bf16",
    # "embed", "head"): what a host issues one after another (software.host_op_s)
    ops: Mapping[str, int] = field(default_factory=dict)


def blocks_times(blk: Blocks, part: int | None = None) -> dict[str, tuple[float, float]]:
    """Each unit's (forward, backward) seconds: all of them, or their compute
    (``part`` 0) or communication (1) only."""

    def of(t: tuple[float, float]) -> float:
        return sum(t) if part is None else t[part]

    return {
        "layer": (of(blk.layer_fwd), of(blk.layer_bwd)),
        "moe": (of(blk.moe_fwd), of(blk.moe_bwd)),
        EMBED_UNIT: (of(blk.embed_fwd), of(blk.embed_bwd)),
        HEAD_UNIT: (of(blk.head_fwd), of(blk.head_bwd)),
    }
