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

__all__ = ["MAX_ENGINE_ROWS", "engine_frame", "trace_frame"]

MAX_ENGINE_ROWS = 200_000
"""Engine chunks kept for the trace: the earliest of the first step, past this many."""


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


def engine_frame(
    sim: StepSim,
    compiled_programs: list[CompiledProgram],
    layout: Layout,
    *,
    lnc: int,
    ranks_per_chip: int,
) -> pd.DataFrame | None:
    """The engine model's chunks on the first simulated rank of each stage, first step.

    One row per chunk of tiles an engine held: rank, chip, core (the rank's first),
    engine, op, layer, microbatch, phase, start_s, end_s, busy_s (the engine's working
    time within the chunk). None with the roofline model.
    """
    import pandas as pd

    from clustersim.hardware.tiles import ENGINE_NAMES

    if not any(c.engine_runs for c in compiled_programs):
        return None
    rpc = ranks_per_chip
    seen: set[int] = set()
    parts: list[dict[str, np.ndarray]] = []
    rows = 0
    for pos, rank in enumerate(sim.ranks):
        stage = layout.stage(rank)
        if stage in seen:
            continue
        seen.add(stage)
        compiled = compiled_programs[stage]
        for j, (seg, run) in enumerate(zip(compiled.segments, compiled.engine_runs, strict=True)):
            t0 = float(sim.seg_start[pos][j])
            if run is None or not run.chunk_op.size or not np.isfinite(t0):
                continue
            idx = seg.i0 + run.chunk_op.astype(np.int64)
            parts.append(
                {
                    "rank": np.full(idx.size, rank, dtype=np.int64),
                    "engine": run.chunk_engine.astype(np.int64),
                    "instr": idx,
                    "start_s": t0 + run.chunk_start_s,
                    "end_s": t0 + run.chunk_end_s,
                    "busy_s": run.chunk_busy_s,
                }
            )
            rows += idx.size
            if rows >= MAX_ENGINE_ROWS:
                break
        if rows >= MAX_ENGINE_ROWS:
            break
    if not parts:
        return None
    cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.argsort(cols["start_s"], kind="stable")[:MAX_ENGINE_ROWS]
    cols = {k: v[order] for k, v in cols.items()}
    rank_col = cols["rank"]
    stage_of = np.array([layout.stage(int(r)) for r in rank_col.tolist()], dtype=np.int64)
    pairs = zip(stage_of.tolist(), cols["instr"].tolist(), strict=True)
    ins = [compiled_programs[s].program.instrs[i] for s, i in pairs]
    engine_names = np.asarray(ENGINE_NAMES, dtype=object)[cols["engine"]]
    return pd.DataFrame(
        {
            "rank": rank_col,
            "chip": rank_col // rpc,
            "core": (rank_col % rpc) * lnc,
            "engine": pd.Categorical(engine_names, categories=list(ENGINE_NAMES)),
            "op": pd.Categorical([i.name for i in ins]),
            "layer": np.array([i.layer for i in ins], dtype=np.int32),
            "microbatch": np.array([i.microbatch for i in ins], dtype=np.int32),
            "phase": pd.Categorical([i.phase for i in ins]),
            "start_s": cols["start_s"],
            "end_s": cols["end_s"],
            "busy_s": cols["busy_s"],
        }
    )
