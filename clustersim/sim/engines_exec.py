"""The engine model's SimPy simulation of one run of compute ops on a core.

Each engine of the core (Tensor, Vector, Scalar, GPSIMD and the DMA queues) is a
``simpy.PriorityResource``. Every stage of every op (:class:`~clustersim.hardware.tiles.TiledOp`)
is a process that takes its engine for one *chunk* of the op's tiles at a time
(at most ``chunks`` per op), so that streams of different ops interleave on an
engine without one event per tile. A chunk streams: it may start once the first
tile of its upstream chunk is through, holds its engine for its tiles, and ends no
earlier than one tile after its upstream chunk ends. For identical tiles on
engines of their own this is exactly the tile-level pipeline (the finish time of
a tile is a maximum of affine functions of its index, so a chunk's last tile is
bounded by its first or by its upstream's last), and a lone op takes
``TiledOp.isolated_s``.

Dependencies between ops:

- an op's compute waits for the previous op to finish (its output is the input),
  plus its issue overhead; its loads may be prefetched while the previous op
  computes if both ops' double-buffered tiles fit in SBUF;
- a ``fused`` op (flash attention: QK^T, softmax, PV) streams chunk by chunk from
  the previous op instead, so Tensor works on chunk c + 1 while Scalar and Vector
  run the softmax of chunk c;
- a load chunk waits until the chunk two before it has been consumed (double
  buffering in SBUF).

When several chunks wait for an engine, program order decides: by fused group,
then by chunk, then by op, which is how the compiler software-pipelines a kernel.

Nothing outside the core can change these times (HBM is the rank's share), so a
run of ops is simulated once per distinct sequence of ops and replayed in the
step simulation as one timeout.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from clustersim.hardware.tiles import DMA, ENGINE_NAMES, TiledOp

__all__ = ["DEFAULT_CHUNKS", "SegmentRun", "run_segment"]

DEFAULT_CHUNKS = 8
"""Chunks per op stage: enough for engines to interleave, few enough to stay fast."""


@dataclass(frozen=True, slots=True)
class SegmentRun:
    """The outcome of a run of ops on one core.

    ``op_end_s`` is when each op finished (non-decreasing); ``busy_s`` the seconds
    each engine of ``ENGINE_NAMES`` worked, then HBM (bytes over the rank's share);
    the chunk columns (``chunk_engine``, ``chunk_op``, ``chunk_start_s``,
    ``chunk_end_s``) are each chunk's hold of its engine, for the trace, and
    ``chunk_busy_s`` the part of it the engine worked (the rest it waited for
    upstream tiles).
    """

    total_s: float
    op_end_s: np.ndarray
    busy_s: np.ndarray
    chunk_engine: np.ndarray
    chunk_op: np.ndarray
    chunk_start_s: np.ndarray
    chunk_end_s: np.ndarray
    chunk_busy_s: np.ndarray
    events: int


def _split(tiles: int, chunks: int) -> list[int]:
    base, extra = divmod(tiles, chunks)
    return [base + (1 if c < extra else 0) for c in range(chunks)]


class _Chunks:
    """Events and times of one stage's chunks."""

    __slots__ = ("end", "end_s", "first", "start")

    def __init__(self, env: simpy.Environment, n: int) -> None:
        self.first = [env.event() for _ in range(n)]  # first tile through
        self.start = [env.event() for _ in range(n)]
        self.end = [env.event() for _ in range(n)]
        self.end_s = [0.0] * n


def run_segment(
    ops: Sequence[TiledOp],
    hbm_rank_Bps: float,
    sbuf_bytes: float,
    *,
    chunks: int = DEFAULT_CHUNKS,
) -> SegmentRun:
    """Simulate ``ops`` in order on one core's engines and return what happened.

    ``hbm_rank_Bps`` is the rank's HBM bandwidth (for HBM's busy time) and
    ``sbuf_bytes`` a core's SBUF (for prefetching).
    """
    env = simpy.Environment()
    engines = [simpy.PriorityResource(env, capacity=1) for _ in ENGINE_NAMES]
    # Fused ops share their group's chunk count, so chunk c streams into chunk c.
    group = [0] * len(ops)
    n_chunks = [min(op.tiles, chunks) for op in ops]
    for i in range(1, len(ops)):
        group[i] = group[i - 1] + (0 if ops[i].fused else 1)
    for g in set(group):
        members = [i for i in range(len(ops)) if group[i] == g]
        common = min(n_chunks[i] for i in members)
        for i in members:
            n_chunks[i] = common
    stages = [[_Chunks(env, n_chunks[i]) for _ in op.stages] for i, op in enumerate(ops)]
    ready = [env.event() for _ in ops]  # compute may start: previous op done + issue
    done = [env.event() for _ in ops]
    done_s = [0.0] * len(ops)
    busy = np.zeros(len(ENGINE_NAMES) + 1)
    rec_engine: list[int] = []
    rec_op: list[int] = []
    rec_start: list[float] = []
    rec_end: list[float] = []
    rec_busy: list[float] = []
    sbuf = _prefetchable(ops, sbuf_bytes)

    def later(event: simpy.Event, delay: float) -> None:
        def fire(_ev: Any) -> None:
            event.succeed()

        if delay > 0:
            env.timeout(delay).callbacks.append(fire)
        else:
            event.succeed()

    def compute_index(op: TiledOp) -> int:
        """The first stage after the loads (the loads alone if the op only moves data)."""
        return 1 if op.stages[0].engine == DMA and len(op.stages) > 1 else 0

    def stage_proc(i: int, s: int) -> Generator[simpy.Event, Any, None]:
        op = ops[i]
        st = op.stages[s]
        t = st.tile_s
        res = engines[st.engine]
        mine = stages[i][s]
        n = n_chunks[i]
        sizes = _split(op.tiles, n)
        first_compute = compute_index(op)
        is_load = st.engine == DMA and s == 0 and first_compute == 1
        ups: list[_Chunks] = []
        if s > 0:
            ups.append(stages[i][s - 1])
        if s == first_compute and op.fused and i > 0 and ops[i - 1].stages:
            ups.append(stages[i - 1][-1])
        gate: simpy.Event | None = None
        if is_load:
            if op.fused or (i > 0 and sbuf[i]):
                # prefetch: once the previous op (or the kernel's first op) has started
                gate = stages[i - 1][0].start[0] if i > 0 and ops[i - 1].stages else ready[i]
            else:
                gate = ready[i]
        elif s == first_compute and not (op.fused and i > 0):
            gate = ready[i]
        consumer = stages[i][first_compute] if is_load else None
        for c in range(n):
            if gate is not None:
                yield gate
            if consumer is not None and c >= 2:
                yield consumer.end[c - 2]  # double buffering: a slot is free again
            for up in ups:
                yield up.first[c]
            req = res.request(priority=(group[i] * chunks + c) * len(ops) + i)
            yield req
            start = env.now
            mine.start[c].succeed()
            later(mine.first[c], t)
            work = sizes[c] * t
            yield env.timeout(work)
            latest = start
            for up in ups:
                yield up.end[c]
                latest = max(latest, up.end_s[c])
            extra = latest + t - env.now
            if ups and extra > 0:
                yield env.timeout(extra)
            res.release(req)
            mine.end_s[c] = env.now
            mine.end[c].succeed()
            busy[st.engine] += work
            rec_engine.append(st.engine)
            rec_op.append(i)
            rec_start.append(start)
            rec_end.append(env.now)
            rec_busy.append(work)

    def op_proc(i: int) -> Generator[simpy.Event, Any, None]:
        op = ops[i]
        if i == 0:
            later(ready[0], op.issue_s)
        for chunk in stages[i]:
            yield chunk.end[-1]
        yield env.timeout(op.tail_s)
        done_s[i] = env.now
        done[i].succeed()
        if i + 1 < len(ops):
            later(ready[i + 1], ops[i + 1].issue_s)

    for i, op in enumerate(ops):
        busy[-1] += op.hbm_bytes / hbm_rank_Bps
        for s in range(len(op.stages)):
            env.process(stage_proc(i, s))
        env.process(op_proc(i))
    env.run()
    if ops and not done[-1].processed:
        raise RuntimeError("engine model deadlocked")
    ends = np.maximum.accumulate(np.asarray(done_s)) if ops else np.zeros(0)
    return SegmentRun(
        float(ends[-1]) if len(ends) else 0.0,
        ends,
        busy,
        np.asarray(rec_engine, dtype=np.int8),
        np.asarray(rec_op, dtype=np.int32),
        np.asarray(rec_start),
        np.asarray(rec_end),
        np.asarray(rec_busy),
        next(env._eid),  # SimPy's event counter: the events this run scheduled
    )


def _prefetchable(ops: Sequence[TiledOp], sbuf_bytes: float) -> list[bool]:
    """Per op: may its loads be prefetched while the previous op computes?

    Yes if both ops' tiles, double-buffered, fit in a core's SBUF
    (``TiledOp.load_bytes`` is one tile's operands on a core).
    """
    out = [False] * len(ops)
    for i in range(1, len(ops)):
        out[i] = 2.0 * (ops[i - 1].load_bytes + ops[i].load_bytes) <= sbuf_bytes
    return out
