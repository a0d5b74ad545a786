"""Turns a finished simulation into the op-level trace DataFrame."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from clustersim.trace import StageColumns, build_frame
from clustersim.workload.program import Kind

if TYPE_CHECKING:
    import pandas as pd

    from clustersim.sim.engine import CompiledProgram, StepSim
    from clustersim.workload import Layout

__all__ = ["trace_frame"]


def trace_frame(
    sim: StepSim,
    compiled_programs: list[CompiledProgram],
    layout: Layout,
    *,
    lnc: int,
    ranks_per_chip: int,
    steps: int,
    failed_at_s: float | None = None,
) -> pd.DataFrame:
    """One row per op of every simulated rank; with ``failed_at_s``, only the ops that
    finished before the step failed."""
    stages: list[StageColumns] = []
    for compiled in compiled_programs:
        instrs = compiled.program.instrs
        stages.append(
            StageColumns(
                resource=sim.resource_names(compiled),
                op=[i.name for i in instrs],
                layer=np.array([i.layer for i in instrs], dtype=np.int32),
                microbatch=np.array([i.microbatch for i in instrs], dtype=np.int32),
                phase=[i.phase for i in instrs],
                flops=np.array(
                    [i.work.tensor_flops if i.work is not None else 0.0 for i in instrs]
                ),
                nbytes=np.array(
                    [
                        i.work.hbm_bytes if i.kind == Kind.COMPUTE and i.work else i.nbytes
                        for i in instrs
                    ]
                ),
            )
        )
    ranks = sim.ranks
    starts, ends = [], []
    for pos, r in enumerate(ranks):
        compiled = compiled_programs[layout.stage(r)]
        warp = sim.slowdown.get(layout.chip_of(r)) if sim.slowdown else None
        op_start, op_end = compiled.op_times(sim.seg_start[pos], sim.seg_end[pos], warp)
        starts.append(op_start)
        ends.append(op_end)
    frame = build_frame(
        stages=stages,
        rank_ids=ranks,
        rank_stage=[layout.stage(r) for r in ranks],
        rank_chip=[layout.chip_of(r) for r in ranks],
        rank_core=[(r % ranks_per_chip) * lnc for r in ranks],
        starts=starts,
        ends=ends,
        steps=steps,
    )
    if failed_at_s is not None:  # keep the ops that finished before the step failed
        frame = frame[frame["end_s"].le(failed_at_s)].reset_index(drop=True)
    return frame
