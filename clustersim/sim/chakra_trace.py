"""The op-level trace of a trace workload: one row per node run, in the columns of a
built run's trace (:data:`clustersim.trace.TRACE_COLUMNS`), so reports read it alike.

A node's ``resource`` is ``compute`` (or ``memory``), ``p2p`` for sends and
receives, ``GROUP:COLLECTIVE`` for collectives (``GROUP`` the ``pg_name``);
``layer`` and ``microbatch`` are -1 and ``phase`` is the node type's name, since a
trace does not say them; ``flops`` is ``num_ops`` and ``bytes`` ``comm_size`` or
``tensor_size``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from clustersim.chakra.graph import Kind, RankGraph
from clustersim.trace import StageColumns, build_frame

if TYPE_CHECKING:
    import pandas as pd

    from clustersim.chakra.traces import Traces
    from clustersim.scenario import Resolved
    from clustersim.sim.chakra_dag import DagSim

__all__ = ["trace_frame"]

_PHASE = {
    Kind.NOOP: "metadata",
    Kind.COMPUTE: "compute",
    Kind.COLLECTIVE: "collective",
    Kind.SEND: "send",
    Kind.RECV: "recv",
    Kind.MEMORY: "memory",
}


def _columns(g: RankGraph, group_names: list[str], pg: list[int]) -> StageColumns:
    kinds = g.kind.tolist()
    resource = []
    for i, k in enumerate(kinds):
        if k == Kind.COLLECTIVE:
            resource.append(f"{group_names[pg[i]]}:{g.collective[i]}")
        elif k in (Kind.SEND, Kind.RECV):
            resource.append("p2p")
        elif k == Kind.MEMORY:
            resource.append("memory")
        else:
            resource.append("compute" if k == Kind.COMPUTE else "metadata")
    comm = np.isin(g.kind, (Kind.COLLECTIVE, Kind.SEND, Kind.RECV))
    return StageColumns(
        resource=resource,
        op=[name or f"node{i}" for name, i in zip(g.names, g.ids, strict=True)],
        layer=np.full(g.size, -1, dtype=np.int32),
        microbatch=np.full(g.size, -1, dtype=np.int32),
        phase=[_PHASE[k] for k in kinds],
        flops=np.nan_to_num(g.num_ops, nan=0.0),
        nbytes=np.where(comm, g.nbytes, np.nan_to_num(g.tensor_size, nan=0.0)),
    )


def trace_frame(
    sim: DagSim, traces: Traces, res: Resolved, *, failed_at_s: float | None = None
) -> pd.DataFrame:
    """One row per node of every rank and recorded step; with ``failed_at_s``, only the
    nodes that ended before the step failed."""
    stages: list[StageColumns] = []
    stage_of: list[int] = []
    seen: dict[int, int] = {}
    for g, pg in zip(traces.graphs, traces.pg, strict=True):
        key = id(g)
        if key not in seen:
            seen[key] = len(stages)
            stages.append(_columns(g, traces.group_names, pg))
        stage_of.append(seen[key])
    ranks = list(range(len(traces.graphs)))
    rpc, lnc = res.ranks_per_chip, res.lnc
    frame = build_frame(
        stages=stages,
        rank_ids=ranks,
        rank_stage=stage_of,
        rank_chip=[r // rpc for r in ranks],
        rank_core=[(r % rpc) * lnc for r in ranks],
        starts=sim.starts,
        ends=sim.ends,
        steps=res.scenario.training.steps,
    )
    if failed_at_s is not None:
        frame = frame[frame["end_s"].le(failed_at_s)].reset_index(drop=True)
    return frame
