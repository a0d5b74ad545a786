"""The op-level trace as a columnar pandas DataFrame.

The simulator records only start and end times per executed instruction; the
descriptive columns come from the stage programs, which every rank of a stage
shares. So the trace costs two floats per op while the simulation runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = ["TRACE_COLUMNS", "StageColumns", "build_frame"]

TRACE_COLUMNS: tuple[str, ...] = (
    "step", "rank", "chip", "core", "resource", "op", "layer", "microbatch", "phase",
    "start_s", "end_s", "flops", "bytes",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class StageColumns:
    """Per-instruction columns of one stage program (shared by its ranks)."""

    resource: Sequence[str]
    op: Sequence[str]
    layer: np.ndarray
    microbatch: np.ndarray
    phase: Sequence[str]
    flops: np.ndarray
    nbytes: np.ndarray


def build_frame(
    *,
    stages: Sequence[StageColumns],
    rank_ids: Sequence[int],
    rank_stage: Sequence[int],
    rank_chip: Sequence[int],
    rank_core: Sequence[int],
    starts: Sequence[np.ndarray],
    ends: Sequence[np.ndarray],
    steps: int,
) -> pd.DataFrame:
    """One row per executed instruction of every simulated rank and step.

    Per-rank sequences are aligned: ``rank_ids[i]`` is the rank whose times are
    ``starts[i]``/``ends[i]`` (all ranks in a detailed run, the representatives in a
    folded one).
    """
    parts: list[pd.DataFrame] = []
    cat_cache: dict[int, dict[str, pd.Categorical[str]]] = {}
    for i, stage in enumerate(rank_stage):
        cols = stages[stage]
        n = len(cols.op)
        if n == 0:
            continue
        cats = cat_cache.get(stage)
        if cats is None:
            cats = {
                "resource": pd.Categorical(list(cols.resource)),
                "op": pd.Categorical(list(cols.op)),
                "phase": pd.Categorical(list(cols.phase)),
            }
            cat_cache[stage] = cats
        reps = len(starts[i]) // n
        frame = pd.DataFrame(
            {
                "step": np.repeat(np.arange(steps - reps, steps, dtype=np.int32), n),
                "rank": np.full(n * reps, rank_ids[i], dtype=np.int32),
                "chip": np.full(n * reps, rank_chip[i], dtype=np.int32),
                "core": np.full(n * reps, rank_core[i], dtype=np.int16),
                "resource": _tile(cats["resource"], reps),
                "op": _tile(cats["op"], reps),
                "layer": np.tile(cols.layer, reps),
                "microbatch": np.tile(cols.microbatch, reps),
                "phase": _tile(cats["phase"], reps),
                "start_s": starts[i],
                "end_s": ends[i],
                "flops": np.tile(cols.flops, reps),
                "bytes": np.tile(cols.nbytes, reps),
            }
        )
        parts.append(frame)
    if not parts:
        return pd.DataFrame({c: [] for c in TRACE_COLUMNS})
    out = pd.concat(parts, ignore_index=True)
    for col in ("resource", "op", "phase"):
        out[col] = out[col].astype("category")
    return out


def _tile(cat: pd.Categorical[str], reps: int) -> pd.Categorical[str]:
    codes = np.tile(cat.codes, reps)
    return pd.Categorical.from_codes(codes, categories=cat.categories)
