"""Builds the SimPy environment for one scenario and runs its training steps.

Each rank is a SimPy process that executes its stage's program. Consecutive
compute ops of a rank are issued as one timeout: nothing outside the rank can
change their durations (HBM is shared statically among a chip's ranks), so this
is exact and keeps the event count down to the synchronisation points.
Collectives meet at a rendezvous: the last member to arrive starts the
collective on the network, and every member resumes when it completes.

A host that issues the program (``StepSim.host_op_s`` > 0, ``software.host_op_s``)
issues each rank's instructions one after another from the step's start, that
long each, running ahead of the device: an instruction does not start before it
is issued (:meth:`CompiledProgram.host_marks`). The device's waits on it are
counted apart (``RankTimes.host_s``, the summary's ``host``). At 0
(every shipped stack but one) nothing changes.

On NCCL (GPUs) the collectives of one communicator run in turn, in issue order.
PyTorch's ProcessGroupNCCL (2.13, ``ProcessGroupNCCL.hpp``) keeps one NCCL
communicator and one CUDA stream per device for each process group
(``devNCCLCommMap_``, ``ncclStreams_``), so a collective starts only when the one
issued before it on that group has ended. Megatron-Core 0.14 reduce-scatters the
gradient buckets (``start_grad_sync``) and all-gathers the distributed optimizer's
parameters (``start_param_sync``) on one group, the DP x CP group
(``param_and_grad_buffer.py``); TP, CP, EP and PP have groups of their own
(``parallel_state.py``). A communicator is one group of ranks in one role
(``Instr.group``); pipeline sends stay outside this ordering. ``StepSim.serial_communicators``
turns it on, and ``simulate`` turns it on for the NCCL runtime (``ChipSpec.runtime``)
only: then a pipeline send does not share its NIC with gradient buckets queued
behind one another on their communicator. The Neuron runtime's ordering of one
replica group's collectives is not modelled.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy
from numpy.typing import NDArray
from simpy.events import PENDING

from clustersim.hardware.chip import RESOURCES
from clustersim.network import Network
from clustersim.sim.compiled import CompiledProgram, compile_program
from clustersim.sim.folding import replica_groups, replica_pairs, representatives
from clustersim.sim.hbm import ComputeRuns
from clustersim.workload import Layout
from clustersim.workload.layout import GROUP_NAMES
from clustersim.workload.program import Instr, Kind

__all__ = ["CompiledProgram", "RankTimes", "StepSim", "compile_program"]
# CompiledProgram and compile_program are defined in sim.compiled (kept importable here).

Progress = Callable[[float], None]
_Rows = NDArray[np.int64] | NDArray[np.int32]
"""Rows of ranks that run one collective or send together (a folded step's replicas)."""


def _succeed(event: simpy.Event) -> None:
    event.succeed()


def _all_of(env: simpy.Environment, events: list[simpy.Event]) -> simpy.Event:
    """``simpy.AllOf(env, events)`` for a process that only waits for it: an event that
    fires at the same point of the schedule (succeeded, or failed with the first failure
    it meets, when ``AllOf`` would be), so every event keeps its place in SimPy's order,
    without the condition's value and its bookkeeping (a detailed step waits on some
    hundred thousand of them)."""
    done = env.event()
    left = len(events)

    def check(event: simpy.Event) -> None:
        nonlocal left
        if done._value is not PENDING:
            return
        left -= 1
        if not event._ok:
            event._defused = True
            done.fail(event._value)
        elif not left:
            done.succeed()

    if not left:
        done.succeed()
    for event in events:
        if event.callbacks is None:
            check(event)
        else:
            event.callbacks.append(check)
    return done


def _record_end(ends: np.ndarray, index: int, env: simpy.Environment) -> Callable[[Any], None]:
    def record(_event: Any) -> None:
        ends[index] = env.now

    return record


@dataclass(slots=True)
class RankTimes:
    """Where one rank's time went, summed over the simulated steps."""

    compute_s: float = 0.0
    optimizer_s: float = 0.0
    exposed_comm_s: float = 0.0
    bubble_s: float = 0.0
    interference_s: float = 0.0
    """Compute time lost to HBM (and, on GPUs, SMs) shared with collectives."""
    host_s: float = 0.0
    """Time the device waited for the host to issue its next instruction."""


@dataclass(slots=True)
class _Slot:
    event: simpy.Event
    sent_at: float | None = None


@dataclass
class StepSim:
    """One simulation: ranks, rendezvous, mailboxes and the network.

    ``folded`` simulates one representative per stage (see ``folding``) and has the
    network carry the traffic of every rank; otherwise every rank is simulated.
    ``slowdown`` maps a straggling chip to ``(t0, work_s) -> duration`` of its compute
    (``clustersim.failures.injection.Slowdown``). Segments that never ran keep NaN times.
    Per-rank arrays (``seg_start``, ``times``...) are indexed by position in ``ranks``.
    """

    env: simpy.Environment
    network: Network
    layout: Layout
    programs: list[CompiledProgram]
    steps: int
    record: bool = True
    progress: Progress | None = None
    folded: bool = False
    slowdown: Mapping[int, Callable[[float, float], float]] | None = None
    chip_model: str = "roofline"
    hbm: ComputeRuns | None = None
    """Compute runs on shared HBM (``sim.hbm``); None keeps every run one timeout."""
    host_op_s: float = 0.0
    """Seconds the host takes to issue one instruction (module doc); 0: never waited on."""
    serial_communicators: bool = False
    """Each communicator (a group of ranks in one role) runs its collectives in turn,
    in issue order, as NCCL does (see the module doc); off, they share links at once."""
    ranks: list[int] = field(default_factory=list)
    seg_start: list[np.ndarray] = field(default_factory=list)
    seg_end: list[np.ndarray] = field(default_factory=list)
    times: list[RankTimes] = field(default_factory=list)
    step_ends: list[float] = field(default_factory=list)
    ops: int = 0

    def __post_init__(self) -> None:
        if not self.ranks:
            self.ranks = (
                representatives(self.layout) if self.folded else list(range(self.layout.ranks))
            )
        lengths = [len(self.programs[self.layout.stage(r)].segments) for r in self.ranks]
        size = self.steps if self.record else 1
        self.seg_start = [np.full(size * n, np.nan) for n in lengths]
        self.seg_end = [np.full(size * n, np.nan) for n in lengths]
        self.times = [RankTimes() for _ in self.ranks]
        self._groups: dict[str, list[tuple[int, ...]]] = {}
        self._replicas: dict[tuple[str, int, int], _Rows] = {}
        self._pending: dict[tuple[tuple[int, ...], int], list[Any]] = {}
        self._mail: dict[tuple[int, int, int], _Slot] = {}
        # The end of the collective issued last on each communicator (group name, ranks).
        self._last: dict[tuple[str, tuple[int, ...]], simpy.Event] = {}
        # Per stage: what its program's segments name (``_program_keys``).
        self._keys: dict[int, tuple[tuple[int, ...], tuple[tuple[str, str], ...]]] = {}
        self._barrier_count = 0
        self._barrier = self.env.event()

    # -- communication -------------------------------------------------------------

    def _group(self, name: str, rank: int) -> tuple[int, ...]:
        if self.folded:
            return self.layout.group(name, rank)
        table = self._groups.get(name)
        if table is None:
            table = [self.layout.group(name, r) for r in range(self.layout.ranks)]
            self._groups[name] = table
        return table[rank]

    def _replica_rows(self, name: str, stage: int, offset: int = 0) -> _Rows:
        key = (name, stage, offset)
        rows = self._replicas.get(key)
        if rows is None:
            if name == "pp":
                made = replica_pairs(self.layout, stage, offset)
            else:
                made = replica_groups(self.layout, name, stage)
            # Ranks in 32 bits where they fit: the rows of every stage's sends are kept.
            fits = self.layout.ranks <= np.iinfo(np.int32).max
            rows = self._replicas[key] = made.astype(np.int32) if fits else made
        return rows

    def _collective(self, ranks: tuple[int, ...], seq: int, ins: Instr) -> simpy.Event:
        """Arrive at the ``seq``-th collective of group ``ranks``; the event fires when done."""
        if len(ranks) == 1:
            return self.env.timeout(0)
        if self.folded:
            # The representative stands for every group of its stage: start them all.
            rows = self._replica_rows(ins.group, self.layout.stage(ranks[0]))
            if not self.serial_communicators:
                return self.network.collective(ins.collective, ranks, ins.nbytes, replicas=rows)
            return self._in_turn(ins, ranks, rows, None)
        key = (ranks, seq)
        slot = self._pending.get(key)
        if slot is None:
            slot = self._pending[key] = [0, self.env.event()]
        slot[0] += 1
        shared: simpy.Event = slot[1]
        if slot[0] == len(ranks):
            del self._pending[key]
            if self.serial_communicators:
                self._in_turn(ins, ranks, None, shared)
            else:
                done = self.network.collective(ins.collective, ranks, ins.nbytes)
                done.callbacks.append(lambda _ev: _succeed(shared))
        return shared

    def _in_turn(
        self,
        ins: Instr,
        ranks: tuple[int, ...],
        rows: _Rows | None,
        end: simpy.Event | None,
    ) -> simpy.Event:
        """Start ``ins`` over ``ranks`` once the collective issued before it on the same
        communicator has ended (at once if none is in flight); ``end`` (a new event if
        None) fires when it ends. Every member issues one communicator's collectives in
        the same order, so the one before is always started or queued already."""
        comm = (ins.group, ranks)
        network = self.network
        prev = self._last.get(comm)
        if prev is None or prev.processed:  # (a Timeout is triggered when made)
            done = network.collective(ins.collective, ranks, ins.nbytes, replicas=rows)
            if end is None:
                end = done
            else:
                target = end
                done.callbacks.append(lambda _e: _succeed(target))
        else:
            if end is None:
                end = self.env.event()
            target = end

            def start(_ev: object) -> None:
                done = network.collective(ins.collective, ranks, ins.nbytes, replicas=rows)
                done.callbacks.append(lambda _e: _succeed(target))

            prev.callbacks.append(start)
        self._last[comm] = end
        return end

    def _slot(self, key: tuple[int, int, int]) -> _Slot:
        slot = self._mail.get(key)
        if slot is None:
            slot = self._mail[key] = _Slot(self.env.event())
        return slot

    def _peer(self, rank: int, offset: int) -> int:
        tp_i, cp_i, dp_i, pp_i = self.layout.coords(rank)
        return self.layout.rank_of(tp_i, cp_i, dp_i, pp_i + offset)

    def _send(self, rank: int, dst: int, ins: Instr) -> None:
        slot = self._slot((rank, dst, ins.tag))
        slot.sent_at = self.env.now
        if self.folded:
            rows = self._replica_rows("pp", self.layout.stage(rank), ins.peer)
            done = self.network.send(rank, dst, ins.nbytes, replicas=rows)
        else:
            done = self.network.send(rank, dst, ins.nbytes)
        target = slot.event
        done.callbacks.append(lambda _ev: _succeed(target))

    # -- processes -----------------------------------------------------------------

    def _program_keys(self, stage: int) -> tuple[tuple[int, ...], tuple[tuple[str, str], ...]]:
        """The pipeline offsets ``stage``'s program sends to or receives from, and the
        (group, collective) pairs its WAIT_ASYNC instructions wait on: one scan of the
        program a stage, not one a rank (some thousand segments each)."""
        keys = self._keys.get(stage)
        if keys is None:
            segments = self.programs[stage].steps_view
            offsets = {ins.peer for _, _, ins in segments if ins is not None and ins.peer}
            waited = dict.fromkeys(
                (ins.group, ins.collective)
                for kind, _, ins in segments
                if kind == Kind.WAIT_ASYNC and ins is not None and ins.group
            )
            keys = self._keys[stage] = (tuple(offsets), tuple(waited))
        return keys

    def rank_process(self, pos: int) -> Generator[simpy.Event, Any, None]:
        env = self.env
        rank = self.ranks[pos]
        stage = self.layout.stage(rank)
        compiled = self.programs[stage]
        seg_start, seg_end, acc = self.seg_start[pos], self.seg_end[pos], self.times[pos]
        report = self.progress if pos == 0 else None
        segments = compiled.steps_view
        seg_hbm = compiled.segment_hbm_bytes
        hbm = self.hbm
        nseg = len(segments)
        groups = {name: self._group(name, rank) for name in GROUP_NAMES}
        offsets, waits = self._program_keys(stage)
        peer = {d: self._peer(rank, d) for d in offsets}
        seq = dict.fromkeys(groups, 0)
        # Async collectives that a WAIT_ASYNC of their group and collective waits for.
        windows: dict[tuple[str, str], list[simpy.Event]] = {key: [] for key in waits}
        slow = self.slowdown.get(self.layout.chip_of(rank)) if self.slowdown else None
        stretch = 0.0
        COMPUTE, COLLECTIVE, ASYNC, WAIT, SEND, RECV = (
            Kind.COMPUTE, Kind.COLLECTIVE, Kind.ASYNC_COLLECTIVE, Kind.WAIT_ASYNC, Kind.SEND,
            Kind.RECV,
        )  # fmt: skip
        exposed = bubble = interference = host_wait = 0.0
        host = compiled.host_marks(self.host_op_s) if self.host_op_s > 0 else None
        for step in range(self.steps):
            base = step * nseg if self.record else 0
            pending: list[simpy.Event] = []
            t_host = env.now  # the host starts issuing the step's program
            for j, (kind, seg_s, ins) in enumerate(segments):
                t0, total_s = env.now, seg_s
                if host is not None:  # not before the host has issued it
                    issued, done = host[j]
                    if t_host + issued > t0:
                        yield env.timeout(t_host + issued - t0)
                        host_wait += env.now - t0
                        t0 = env.now
                    if kind == COMPUTE and t_host + done > t0 + total_s:
                        total_s = t_host + done - t0
                        host_wait += total_s - seg_s
                        seg_end[base + j] = t0 + total_s  # stretched: its ops spread
                seg_start[base + j] = t0
                if kind == COMPUTE:
                    if slow is None:
                        if hbm is None or not seg_hbm[j] or not total_s:
                            yield env.timeout(total_s)
                            continue
                        hbm.begin(pos, seg_hbm[j], total_s)
                        yield env.timeout(total_s)
                        rest = hbm.end(pos)
                        if rest is not None:  # it met flows on the chip's HBM
                            yield rest
                            interference += max(env.now - t0 - total_s, 0.0)
                            seg_end[base + j] = env.now
                        continue
                    took = slow(t0, total_s)
                    yield env.timeout(took)
                    seg_end[base + j] = env.now
                    stretch += took - total_s
                    continue
                assert ins is not None
                if kind in (COLLECTIVE, ASYNC):
                    group = ins.group
                    ev = self._collective(groups[group], seq[group], ins)
                    seq[group] += 1
                    if kind == ASYNC:
                        ev.callbacks.append(_record_end(seg_end, base + j, env))
                        pending.append(ev)
                        window = windows.get((group, ins.collective))
                        if window is not None:
                            window.append(ev)
                        continue
                    yield ev
                    exposed += env.now - t0
                elif kind == WAIT:
                    if ins.group:  # the oldest of one group's collectives (prefetching)
                        window = windows[(ins.group, ins.collective)]
                        due = len(window) - ins.tag
                        if due > 0:
                            yield _all_of(env, window[:due])
                            del window[:due]
                    elif pending:
                        yield _all_of(env, pending)
                        pending = []
                        for window in windows.values():
                            window.clear()
                    exposed += env.now - t0
                elif kind == SEND:
                    self._send(rank, peer[ins.peer], ins)
                elif kind == RECV:
                    key = (peer[ins.peer], rank, ins.tag)
                    slot = self._slot(key)
                    yield slot.event
                    del self._mail[key]
                    sent = slot.sent_at if slot.sent_at is not None else t0
                    waited = min(max(sent - t0, 0.0), env.now - t0)
                    bubble += waited
                    exposed += env.now - t0 - waited
                seg_end[base + j] = env.now
                if report is not None and j % 64 == 0:
                    report((step + j / nseg) / self.steps)
            if pending:  # a program that never waits still finishes its collectives
                yield _all_of(env, pending)
            for window in windows.values():
                window.clear()
            acc.compute_s += compiled.compute_s
            acc.optimizer_s += compiled.optimizer_s
            work = compiled.compute_s + compiled.optimizer_s
            if stretch and work > 0:  # a straggler's extra time, shared as its work is
                acc.compute_s += stretch * compiled.compute_s / work
                acc.optimizer_s += stretch * compiled.optimizer_s / work
                stretch = 0.0
            self.ops += len(compiled.program.instrs)
            t_done = env.now
            yield self._arrive_barrier()
            # With a pipeline, the wait for the other stages to drain is bubble too:
            # the last stage finishes its backwards (pp - 1) slots before the first.
            if self.layout.pp > 1:
                bubble += env.now - t_done
            if report is not None:
                report((step + 1) / self.steps)
        acc.exposed_comm_s, acc.bubble_s, acc.interference_s = exposed, bubble, interference
        acc.host_s = host_wait

    def _arrive_barrier(self) -> simpy.Event:
        event = self._barrier
        self._barrier_count += 1
        if self._barrier_count == len(self.ranks):
            self._barrier_count = 0
            self._barrier = self.env.event()
            self.step_ends.append(self.env.now)
            event.succeed()
        return event

    def run(self) -> float:
        """Run every step; return the wall time in seconds."""
        t0 = time.perf_counter()
        ranks = [self.env.process(self.rank_process(pos)) for pos in range(len(self.ranks))]
        # Stop when the ranks are done: events left (a later injection, a superseded
        # wake-up) must not move the clock past the end of the run.
        finished = simpy.AllOf(self.env, ranks)
        try:
            self.env.run(until=finished)
        except RuntimeError as exc:  # SimPy's: nothing left to run, ranks not done
            if finished.triggered or not str(exc).startswith("No scheduled events left"):
                raise
        if len(self.step_ends) != self.steps:
            stuck = [*self._pending, *self._mail]
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
