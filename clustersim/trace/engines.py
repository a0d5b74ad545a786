"""The engine model's timeline (``chip_model: engines``): each engine's chunks of tiles.

``engines.parquet`` holds one row per chunk of tiles an engine of a representative
core held (the first rank of each pipeline stage, first step); ``trace.json``
draws them as one thread per engine under the rank's chip, so Perfetto shows
which engine bounds a layer and how Tensor, Vector, Scalar and the DMA queues
overlap. A chunk is the span its engine was held for; ``busy_fraction`` says how
much of it the engine worked (the rest it waited for tiles from upstream).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

__all__ = ["ENGINE_COLUMNS", "ENGINE_TABLE", "engine_trace_events"]

ENGINE_TABLE = "engines.parquet"
ENGINE_COLUMNS: tuple[str, ...] = (
    "rank", "chip", "core", "engine", "op", "layer", "microbatch", "phase", "start_s", "end_s",
    "busy_s",
)  # fmt: skip
ENGINE_ORDER: tuple[str, ...] = ("tensor", "vector", "scalar", "gpsimd", "dma")
_TID_BASE = 1 << 30
"""Engine threads sit after every rank's own threads in a chip's process."""


def engine_trace_events(frame: pd.DataFrame, budget: int) -> tuple[list[str], bool]:
    """Chrome trace events (thread names, then ``X`` slices) for ``frame``, at most
    ``budget`` slices (the earliest); and whether some were left out."""
    if frame.empty or budget <= 0:
        return [], not frame.empty
    cut = len(frame) > budget
    sub = frame.nsmallest(budget, "start_s") if cut else frame
    engine = np.array(
        [ENGINE_ORDER.index(str(e)) for e in sub["engine"].astype(str).tolist()], dtype=np.int64
    )
    rank = sub["rank"].to_numpy(dtype=np.int64)
    tid = _TID_BASE + rank * len(ENGINE_ORDER) + engine
    chip = sub["chip"].to_numpy(dtype=np.int64)
    core = sub["core"].to_numpy(dtype=np.int64)
    out: list[str] = []
    keys = np.unique(np.stack([chip, tid, rank, core, engine], axis=1), axis=0)
    for c, t, r, k, e in keys.tolist():
        name = f"rank {r} core {k}: {ENGINE_ORDER[e]} tiles"
        for kind, args in (
            ("thread_name", {"name": name}),
            ("thread_sort_index", {"sort_index": t}),
        ):
            meta = {"name": kind, "ph": "M", "ts": 0, "pid": c, "tid": t, "args": args}
            out.append(json.dumps(meta, separators=(",", ":")))
    start = np.round(sub["start_s"].to_numpy() * 1e6, 3)
    dur = np.maximum(np.round(sub["end_s"].to_numpy() * 1e6, 3) - start, 0.0)
    span = (sub["end_s"] - sub["start_s"]).to_numpy()
    busy = np.where(span > 0, sub["busy_s"].to_numpy() / np.where(span > 0, span, 1.0), 1.0)
    for op, ph, layer, mb, ts, d, c, t, b in zip(
        sub["op"].astype(str).tolist(), sub["phase"].astype(str).tolist(),
        sub["layer"].tolist(), sub["microbatch"].tolist(), start.tolist(), dur.tolist(),
        chip.tolist(), tid.tolist(), np.minimum(busy, 1.0).tolist(), strict=True,
    ):  # fmt: skip
        out.append(
            f'{{"name":{json.dumps(op)},"cat":"engine","ph":"X","ts":{ts:.3f},"dur":{d:.3f},'
            f'"pid":{c},"tid":{t},"args":{{"phase":{json.dumps(ph)},"layer":{layer},'
            f'"microbatch":{mb},"busy_fraction":{b:.3f}}}}}'
        )
    return out, cut
