"""Symmetry folding: one representative rank per pipeline stage.

Every rank of a stage runs the same program, and the fabric treats the DP
replicas and TP/CP peers of a stage alike, so their timelines are the same.
Under skewed MoE routing the stage's program is that of the rank holding the
busiest experts (``workload.moe``), so every rank is that representative: the
step is paced by it, since every rank waits for it at each combine all-to-all.
A folded run simulates one representative per stage (TP, CP and DP index 0)
with a multiplicity of ``tp * cp * dp``. The network still carries every
rank's traffic: when a representative starts a collective, the same collective
of every other group of its stage is started with it, as one coflow, so links
that the groups share (EFA tiers, a torus shared by two groups) are as loaded as
in the detailed run.

Replica groups are computed with numpy from the rank numbering (TP fastest,
then CP, then DP, then PP), so nothing here grows with Python loops over ranks.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from clustersim.workload import Layout

__all__ = ["replica_groups", "replica_pairs", "representatives"]

IntArray = NDArray[np.int64]


def representatives(layout: Layout) -> list[int]:
    """The simulated rank of each stage: TP, CP and DP index 0."""
    return [stage * layout.ranks_per_stage for stage in range(layout.pp)]


def _stage_grid(layout: Layout, stage: int) -> IntArray:
    """Ranks of ``stage`` as an array indexed [dp_i, cp_i, tp_i]."""
    base = stage * layout.ranks_per_stage
    return np.arange(base, base + layout.ranks_per_stage, dtype=np.int64).reshape(
        layout.dp, layout.cp, layout.tp
    )


def replica_groups(layout: Layout, name: str, stage: int) -> IntArray:
    """Every ``name`` group of ``stage``, one per row, the representative's first.

    Row ``i`` lists the group's ranks in order of their ``name`` index, so the
    same algorithm step maps onto every row alike.
    """
    grid = _stage_grid(layout, stage)
    if name in ("ep", "etp", "edp", "edp_shard", "ep_node", "ep_cross"):
        return _expert_groups(layout, grid, name)
    if name == "tp":
        return grid.reshape(-1, layout.tp)
    if name == "cp":
        return grid.transpose(0, 2, 1).reshape(-1, layout.cp)
    if name in ("dp", "dp_cp"):  # dp_cp: the dp and cp indices, dp_i * cp + cp_i
        rows = layout.dp * (layout.cp if name == "dp_cp" else 1)
        return grid.reshape(rows, -1).T.copy()
    if name == "dp_shard":  # dp index = replica * shard + shard index; with every CP index
        return (
            grid.reshape(layout.replicas, layout.shard, layout.cp, layout.tp)
            .transpose(0, 3, 1, 2)
            .reshape(-1, layout.shard_size)
        )
    if name == "dp_replicate":
        return grid.reshape(layout.replicas, -1).T.copy()
    valid = (
        "tp, cp, dp, dp_shard, dp_replicate, ep, etp, edp, edp_shard, ep_node, ep_cross or dp_cp"
    )
    raise ValueError(f"no replica groups for {name!r} ({valid})")


def _expert_groups(layout: Layout, grid: IntArray, name: str) -> IntArray:
    """The MoE numbering of the stage's ranks: [edp_i, ep_i, etp_i], etp fastest."""
    moe = grid.reshape(layout.edp, layout.ep, layout.etp)
    if name == "etp":
        return moe.reshape(-1, layout.etp)
    if name == "ep":
        return moe.transpose(0, 2, 1).reshape(-1, layout.ep)
    if name in ("ep_node", "ep_cross"):  # ep index = node * ep_local + local index
        split = moe.reshape(layout.edp, layout.ep_nodes, layout.ep_local, layout.etp)
        if name == "ep_node":
            return split.transpose(0, 1, 3, 2).reshape(-1, layout.ep_local)
        return split.transpose(0, 2, 3, 1).reshape(-1, layout.ep_nodes)
    if name == "edp_shard":  # edp index = replica * expert_shard + shard index
        return (
            moe.reshape(layout.replicas, layout.expert_shard, -1)
            .transpose(0, 2, 1)
            .reshape(-1, layout.expert_shard)
        )
    return moe.reshape(layout.edp, -1).T.copy()


def replica_pairs(layout: Layout, stage: int, offset: int) -> IntArray:
    """(src, dst) of every rank of ``stage`` sending to its peer ``offset`` stages away."""
    src = _stage_grid(layout, stage).reshape(-1)
    return np.stack([src, src + offset * layout.ranks_per_stage], axis=1)
