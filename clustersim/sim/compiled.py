"""A stage program compiled on a chip: each op's duration and bounding resource, the
runs of consecutive compute ops the engine issues as one timeout (segments), and the
FLOPs and seconds per step. With the engine model (``chip_model: engines``) a
segment's ops are lowered into tile streams and run on the engines, consecutive
flash-attention pieces of one kernel streaming into each other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np

from clustersim.hardware.chip import ChipModel
from clustersim.hardware.engines import EngineChip
from clustersim.hardware.tiles import ENGINE_NAMES, TiledOp
from clustersim.sim.engines_exec import SegmentRun, run_segment
from clustersim.workload.program import Instr, Kind, Phase, Program

__all__ = ["CompiledProgram", "compile_program"]

_COMPUTE_PHASES = (Phase.FORWARD, Phase.BACKWARD, Phase.RECOMPUTE)


@dataclass(slots=True)
class _Segment:
    """A run of consecutive compute ops, or one communication instruction."""

    kind: Kind
    i0: int
    i1: int
    total_s: float = 0.0
    offsets: np.ndarray | None = None  # start offsets of ops i0..i1 (len i1-i0+1)
    instr: Instr | None = None


@dataclass(slots=True)
class CompiledProgram:
    """A stage program with op durations resolved on a chip."""

    program: Program
    durations_s: np.ndarray
    bound: np.ndarray  # index into RESOURCES per compute op; -1 for communication
    segments: list[_Segment]
    tensor_flops: float
    recompute_flops: float
    compute_s: float  # forward, backward and recompute ops per step
    optimizer_s: float
    steps_view: list[tuple[Kind, float, Instr | None]] = field(default_factory=list)
    engine_runs: list[SegmentRun | None] = field(default_factory=list)
    """With the engine model: each segment's run on the engines (None for communication)."""
    engine_busy_s: np.ndarray | None = None
    """With the engine model: seconds per step each engine (``ENGINE_NAMES``, then HBM) works."""
    segment_hbm_bytes: list[float] = field(default_factory=list)
    """HBM bytes of each segment's compute ops (0 for communication)."""

    def __post_init__(self) -> None:
        # The rank loop unpacks tuples: cheaper than attribute access per segment.
        self.steps_view = [(seg.kind, seg.total_s, seg.instr) for seg in self.segments]
        if not self.segment_hbm_bytes:
            instrs = self.program.instrs
            hbm = [0.0 if i.work is None else i.work.hbm_bytes for i in instrs]
            self.segment_hbm_bytes = [
                sum(hbm[seg.i0 : seg.i1]) if seg.kind == Kind.COMPUTE else 0.0
                for seg in self.segments
            ]

    def host_marks(self, host_op_s: float) -> list[tuple[float, float]]:
        """Per segment, when the host has issued its first op and by when its last op can
        have finished, from the step's start, for a host that issues the program's
        instructions one after another, ``host_op_s`` each, ahead of the device
        (``software.host_op_s``): instruction ``i`` is issued at ``(i + 1) x host_op_s``,
        and a segment's last op ends no sooner than its issue plus its duration."""
        marks = []
        for seg in self.segments:
            last = seg.i1 * host_op_s
            if seg.kind == Kind.COMPUTE:
                last += float(self.durations_s[seg.i1 - 1])
            marks.append(((seg.i0 + 1) * host_op_s, last))
        return marks

    def op_times(
        self,
        seg_start: np.ndarray,
        seg_end: np.ndarray,
        warp: Callable[[float, float], float] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per-instruction start and end times from per-segment ones (any number of steps).

        ``warp`` is the rank's chip's slowdown (``StepSim.slowdown``), if it straggles.
        """
        nseg = len(self.segments)
        steps = len(seg_start) // nseg if nseg else 0
        n = len(self.program.instrs)
        starts, ends = np.empty(n * steps), np.empty(n * steps)
        for step in range(steps):
            for j, seg in enumerate(self.segments):
                t0 = seg_start[step * nseg + j]
                a, b = step * n + seg.i0, step * n + seg.i1
                if seg.offsets is not None:
                    offsets = seg.offsets
                    t1 = seg_end[step * nseg + j]  # recorded only for a stretched run
                    if t1 > t0 + seg.total_s > t0:
                        if warp is not None:
                            offsets = np.asarray([warp(t0, w) for w in offsets.tolist()])
                        else:  # stretched by shared HBM: spread over the ops alike
                            offsets = offsets * ((t1 - t0) / seg.total_s)
                    starts[a:b] = t0 + offsets[:-1]
                    ends[a:b] = t0 + offsets[1:]
                else:
                    starts[a], ends[a] = t0, seg_end[step * nseg + j]
        return starts, ends


def compile_program(
    program: Program,
    chip: ChipModel,
    engines: EngineChip | None = None,
    *,
    fuse_attention: bool = True,
    segment_cache: dict[tuple[TiledOp, ...], SegmentRun] | None = None,
) -> CompiledProgram:
    """Resolve a program's op durations on ``chip`` (the roofline model), or with
    ``engines`` on the engine model: each run of compute ops is simulated on the
    core's engines once per distinct sequence of ops (``segment_cache``, shareable
    across stages) and replayed as one timeout. ``fuse_attention``: the attention
    core's ops stream into each other (flash attention), on the engine model.
    """
    instrs = program.instrs
    n = len(instrs)
    # Plain lists, turned into arrays once: a stage of a folded MoE step has 10^5 ops.
    seconds = [0.0] * n
    bounds = [-1] * n
    cache: dict[int, tuple[float, int, float]] = {}
    flops = recompute = 0.0
    compute = Kind.COMPUTE
    for i, ins in enumerate(instrs):
        work = ins.work
        if ins.kind != compute or work is None:
            continue
        key = id(work)
        hit = cache.get(key)
        if hit is None:
            t = chip.op_time(work)
            hit = cache[key] = (t.seconds, t.bound, work.tensor_flops)
        seconds[i], bounds[i], op_flops = hit
        flops += op_flops
        if ins.phase == Phase.RECOMPUTE:
            recompute += op_flops
    durations = np.asarray(seconds, dtype=np.float64)
    bound = np.asarray(bounds, dtype=np.int8)
    runs: list[SegmentRun | None] = []
    busy: np.ndarray | None = None
    if engines is not None:
        runs, busy = _engine_durations(
            instrs, engines, durations, bound, fuse=fuse_attention,
            cache={} if segment_cache is None else segment_cache,
        )  # fmt: skip

    if engines is not None:
        seconds = durations.tolist()
    segments: list[_Segment] = []
    i = 0
    while i < n:
        ins = instrs[i]
        if ins.kind != compute:
            segments.append(_Segment(ins.kind, i, i + 1, 0.0, None, ins))
            i += 1
            continue
        j = i
        while j < n and instrs[j].kind == compute:
            j += 1
        # accumulate adds in order, as np.cumsum does: the same offsets, bit for bit
        offsets = np.asarray(list(accumulate(seconds[i:j], initial=0.0)))
        segments.append(_Segment(compute, i, j, float(offsets[-1]), offsets, None))
        i = j
    code = {Phase.OPTIMIZER: 1, **dict.fromkeys(_COMPUTE_PHASES, 2)}
    phases = np.fromiter((code.get(ins.phase, 0) for ins in instrs), dtype=np.int8, count=n)
    optimizer_s = float(durations[phases == 1].sum())
    compute_s = float(durations[phases == 2].sum())
    return CompiledProgram(
        program, durations, bound, segments, flops, recompute, compute_s, optimizer_s,
        engine_runs=runs, engine_busy_s=busy,
    )  # fmt: skip


def _fused(prev: Instr | None, ins: Instr) -> bool:
    """Does ``ins`` stream from ``prev`` (both in one flash-attention kernel)?"""
    return (
        prev is not None
        and ins.name.startswith("attn.core.")
        and prev.name.startswith("attn.core.")
        and (prev.layer, prev.microbatch, prev.phase) == (ins.layer, ins.microbatch, ins.phase)
    )


def _engine_durations(
    instrs: list[Instr],
    engines: EngineChip,
    durations: np.ndarray,
    bound: np.ndarray,
    *,
    fuse: bool,
    cache: dict[tuple[TiledOp, ...], SegmentRun],
) -> tuple[list[SegmentRun | None], np.ndarray]:
    """Overwrite ``durations`` and ``bound`` of compute ops with the engine model's;
    return each segment's run (None for communication) and the engines' busy seconds."""
    n = len(instrs)
    runs: list[SegmentRun | None] = []
    busy = np.zeros(len(ENGINE_NAMES) + 1)
    i = 0
    while i < n:
        if instrs[i].kind != Kind.COMPUTE:
            runs.append(None)
            i += 1
            continue
        j = i
        ops: list[TiledOp] = []
        prev: Instr | None = None
        while j < n and instrs[j].kind == Kind.COMPUTE:
            ins = instrs[j]
            assert ins.work is not None
            fused = fuse and bool(ops) and _fused(prev, ins)
            ops.append(engines.lower(ins.work, fused, ops[-1].tiles if fused else 0))
            prev = ins
            j += 1
        key = tuple(ops)
        run = cache.get(key)
        if run is None:
            run = cache[key] = run_segment(ops, engines.hbm_rank_Bps, engines.sbuf_bytes_per_core)
        durations[i:j] = np.diff(run.op_end_s, prepend=0.0)
        bound[i:j] = [op.bound for op in ops]
        busy += run.busy_s
        runs.append(run)
        i = j
    return runs, busy
