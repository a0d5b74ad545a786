"""Builds the SimPy environment for one scenario and runs its training steps.

Each rank is a SimPy process that executes its stage's program. Consecutive
compute ops of a rank are issued as one timeout: nothing outside the rank can
change their durations (HBM is shared statically among a chip's ranks), so this
is exact and keeps the event count down to the synchronisation points.
Collectives meet at a rendezvous: the last member to arrive starts the
collective on the network, and every member resumes when it completes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from clustersim.hardware.chip import RESOURCES, ChipModel
from clustersim.network import Network
from clustersim.workload import Layout
from clustersim.workload.program import Instr, Kind, Phase, Program

__all__ = ["CompiledProgram", "RankTimes", "StepSim", "compile_program"]

Progress = Callable[[float], None]
_COMPUTE_PHASES = (Phase.FORWARD, Phase.BACKWARD, Phase.RECOMPUTE)


@dataclass(slots=True)
class _Segment:
    """A run of consecutive compute ops, or one communication instruction."""

    kind: Kind
    i0: int
    i1: int
    total_s: float = 0.0
    compute_s: float = 0.0
    optimizer_s: float = 0.0
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


def compile_program(program: Program, chip: ChipModel) -> CompiledProgram:
    instrs = program.instrs
    n = len(instrs)
    durations = np.zeros(n)
    bound = np.full(n, -1, dtype=np.int8)
    cache: dict[int, tuple[float, int]] = {}
    flops = recompute = 0.0
    for i, ins in enumerate(instrs):
        if ins.kind != Kind.COMPUTE or ins.work is None:
            continue
        key = id(ins.work)
        hit = cache.get(key)
        if hit is None:
            t = chip.op_time(ins.work)
            hit = cache[key] = (t.seconds, t.bound)
        durations[i], bound[i] = hit
        flops += ins.work.tensor_flops
        if ins.phase == Phase.RECOMPUTE:
            recompute += ins.work.tensor_flops

    segments: list[_Segment] = []
    i = 0
    while i < n:
        ins = instrs[i]
        if ins.kind != Kind.COMPUTE:
            segments.append(_Segment(ins.kind, i, i + 1, instr=ins))
            i += 1
            continue
        j = i
        while j < n and instrs[j].kind == Kind.COMPUTE:
            j += 1
        d = durations[i:j]
        offsets = np.concatenate(([0.0], np.cumsum(d)))
        phases = [instrs[k].phase for k in range(i, j)]
        opt = float(sum(d[k] for k, p in enumerate(phases) if p == Phase.OPTIMIZER))
        comp = float(sum(d[k] for k, p in enumerate(phases) if p in _COMPUTE_PHASES))
        segments.append(
            _Segment(Kind.COMPUTE, i, j, float(offsets[-1]), comp, opt, offsets, None)
        )
        i = j
    return CompiledProgram(program, durations, bound, segments, flops, recompute)


@dataclass(slots=True)
class RankTimes:
    """Where one rank's time went, summed over the simulated steps."""

    compute_s: float = 0.0
    optimizer_s: float = 0.0
    exposed_comm_s: float = 0.0
    bubble_s: float = 0.0


@dataclass(slots=True)
class _Slot:
    event: simpy.Event
    sent_at: float | None = None


@dataclass
class StepSim:
    """One simulation: ranks, rendezvous, mailboxes and the network."""

    env: simpy.Environment
    network: Network
    layout: Layout
    programs: list[CompiledProgram]
    steps: int
    record: bool = True
    progress: Progress | None = None
    starts: list[np.ndarray] = field(default_factory=list)
    ends: list[np.ndarray] = field(default_factory=list)
    times: list[RankTimes] = field(default_factory=list)
    step_ends: list[float] = field(default_factory=list)
    ops: int = 0

    def __post_init__(self) -> None:
        ranks = self.layout.ranks
        lengths = [len(self.programs[self.layout.stage(r)].program.instrs) for r in range(ranks)]
        size = self.steps if self.record else 1
        self.starts = [np.zeros(size * n) for n in lengths]
        self.ends = [np.zeros(size * n) for n in lengths]
        self.times = [RankTimes() for _ in range(ranks)]
        self._groups: dict[str, list[tuple[int, ...]]] = {}
        self._seq: dict[tuple[int, str], int] = {}
        self._pending: dict[tuple[tuple[int, ...], int], list[Any]] = {}
        self._mail: dict[tuple[int, int, int], _Slot] = {}
        self._barrier_count = 0
        self._barrier = self.env.event()

    # -- communication -------------------------------------------------------------

    def _group(self, name: str, rank: int) -> tuple[int, ...]:
        table = self._groups.get(name)
        if table is None:
            table = [self.layout.group(name, r) for r in range(self.layout.ranks)]
            self._groups[name] = table
        return table[rank]

    def _collective(self, rank: int, ins: Instr) -> simpy.Event:
        ranks = self._group(ins.group, rank)
        if len(ranks) == 1:
            return self.env.timeout(0)
        seq_key = (rank, ins.group)
        seq = self._seq.get(seq_key, 0)
        self._seq[seq_key] = seq + 1
        key = (ranks, seq)
        slot = self._pending.get(key)
        if slot is None:
            slot = self._pending[key] = [0, self.env.event()]
        slot[0] += 1
        if slot[0] == len(ranks):
            del self._pending[key]
            done = self.network.collective(ins.collective, ranks, ins.nbytes)
            shared: simpy.Event = slot[1]
            done.callbacks.append(lambda _ev: shared.succeed())
        event: simpy.Event = slot[1]
        return event

    def _slot(self, key: tuple[int, int, int]) -> _Slot:
        slot = self._mail.get(key)
        if slot is None:
            slot = self._mail[key] = _Slot(self.env.event())
        return slot

    def _peer(self, rank: int, offset: int) -> int:
        tp_i, cp_i, dp_i, pp_i = self.layout.coords(rank)
        return self.layout.rank_of(tp_i, cp_i, dp_i, pp_i + offset)

    def _send(self, rank: int, ins: Instr) -> None:
        dst = self._peer(rank, ins.peer)
        slot = self._slot((rank, dst, ins.tag))
        slot.sent_at = self.env.now
        done = self.network.send(rank, dst, ins.nbytes)
        target = slot.event
        done.callbacks.append(lambda _ev: target.succeed())

    # -- processes -----------------------------------------------------------------

    def rank_process(self, rank: int) -> Generator[simpy.Event, Any, None]:
        env = self.env
        compiled = self.programs[self.layout.stage(rank)]
        n = len(compiled.program.instrs)
        starts, ends, acc = self.starts[rank], self.ends[rank], self.times[rank]
        report = self.progress if rank == 0 else None
        nseg = len(compiled.segments)
        for step in range(self.steps):
            base = step * n if self.record else 0
            pending: list[simpy.Event] = []
            for s_idx, seg in enumerate(compiled.segments):
                t0 = env.now
                kind = seg.kind
                if kind == Kind.COMPUTE:
                    assert seg.offsets is not None
                    starts[base + seg.i0 : base + seg.i1] = t0 + seg.offsets[:-1]
                    ends[base + seg.i0 : base + seg.i1] = t0 + seg.offsets[1:]
                    acc.compute_s += seg.compute_s
                    acc.optimizer_s += seg.optimizer_s
                    yield env.timeout(seg.total_s)
                    continue
                ins = seg.instr
                assert ins is not None
                idx = base + seg.i0
                starts[idx] = t0
                if kind == Kind.COLLECTIVE:
                    yield self._collective(rank, ins)
                    acc.exposed_comm_s += env.now - t0
                elif kind == Kind.ASYNC_COLLECTIVE:
                    ev = self._collective(rank, ins)
                    ev.callbacks.append(lambda _e, i=idx: ends.__setitem__(i, env.now))
                    pending.append(ev)
                    continue
                elif kind == Kind.WAIT_ASYNC:
                    if pending:
                        yield simpy.AllOf(env, pending)
                        pending = []
                    acc.exposed_comm_s += env.now - t0
                elif kind == Kind.SEND:
                    self._send(rank, ins)
                elif kind == Kind.RECV:
                    key = (self._peer(rank, ins.peer), rank, ins.tag)
                    slot = self._slot(key)
                    yield slot.event
                    del self._mail[key]
                    sent = slot.sent_at if slot.sent_at is not None else t0
                    bubble = min(max(sent - t0, 0.0), env.now - t0)
                    acc.bubble_s += bubble
                    acc.exposed_comm_s += env.now - t0 - bubble
                ends[idx] = env.now
                if report is not None and s_idx % 64 == 0:
                    report((step + s_idx / nseg) / self.steps)
            if pending:  # a program that never waits still finishes its collectives
                yield simpy.AllOf(env, pending)
            self.ops += n
            yield self._arrive_barrier()
            if report is not None:
                report((step + 1) / self.steps)

    def _arrive_barrier(self) -> simpy.Event:
        event = self._barrier
        self._barrier_count += 1
        if self._barrier_count == self.layout.ranks:
            self._barrier_count = 0
            self._barrier = self.env.event()
            self.step_ends.append(self.env.now)
            event.succeed()
        return event

    def run(self) -> float:
        """Run every step; return the wall time in seconds."""
        t0 = time.perf_counter()
        for rank in range(self.layout.ranks):
            self.env.process(self.rank_process(rank))
        self.env.run()
        if len(self.step_ends) != self.steps:
            stuck = [k for k in self._pending] + [k for k in self._mail]
            raise RuntimeError(f"simulation deadlocked; waiting on {stuck[:3]}")
        return time.perf_counter() - t0

    @property
    def step_times_s(self) -> list[float]:
        return list(np.diff([0.0, *self.step_ends]))

    def resource_names(self, compiled: CompiledProgram) -> list[str]:
        out: list[str] = []
        for ins, b in zip(compiled.program.instrs, compiled.bound, strict=True):
            if b >= 0:
                out.append(RESOURCES[b])
            elif ins.kind in (Kind.SEND, Kind.RECV):
                out.append("p2p")
            elif ins.kind == Kind.WAIT_ASYNC:
                out.append("wait")
            else:
                out.append(f"{ins.group}:{ins.collective}")
        return out
