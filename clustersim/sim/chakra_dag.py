"""Execution traces run as dependency graphs, one per rank, on the simulated network.

The built workloads run as instruction lists (:mod:`clustersim.sim.engine`); a
Chakra trace is a graph, where a node starts once every node it depends on has
ended, so it runs here, on the same pieces: collectives and sends go through
:class:`~clustersim.network.Network` (the fabric, its flow sharing, the
collective algorithms and the runtime's costs), compute runs through
:class:`~clustersim.sim.hbm.ComputeRuns` on the chip's shared HBM, an injected
straggler stretches compute as it does in the engine, and a chip going down
raises the same ``StepFailure``.

What runs at once, as ASTRA-sim runs a trace: a rank computes one node at a time
(its ready compute nodes queue in the order they became ready); communication
starts as soon as it is ready and any number of a rank's collectives and sends
may be in flight, sharing the links as flows. Collectives of one process group
are matched across its ranks by issue order (the k-th of each member is one
collective; members that disagree on its type or size are an error), and on
NCCL each group's collectives run in turn, as ``StepSim.serial_communicators``
does. A send's node ends when its data has arrived; a receive ends when the
matching send's data (same source, destination and tag, first in first out) has
arrived, and not before it is posted. Memory nodes take their time without the
compute stream. ``steps`` runs the graphs that many times, each step ended by a
barrier of every rank.

Callbacks rather than a process per rank: a node's end starts its successors
through a work list, so chains of nodes that take no time cost no SimPy events
and no recursion.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy
from numpy.typing import NDArray

from clustersim.chakra.graph import Kind, RankGraph
from clustersim.errors import MISSING, ScenarioError
from clustersim.network import Network
from clustersim.sim.hbm import ComputeRuns

__all__ = ["DagSim", "RankUse"]


def _succeed(event: simpy.Event) -> None:
    event.succeed()


Progress = Callable[[float], None]


@dataclass(slots=True)
class RankUse:
    """Where one rank's time went, summed over the steps: computing (at full speed),
    computing slowed by HBM shared with flows, waiting on communication with no
    compute to run, and idle (neither)."""

    compute_s: float = 0.0
    interference_s: float = 0.0
    exposed_comm_s: float = 0.0
    idle_s: float = 0.0


@dataclass
class _Rank:
    graph: RankGraph
    durations: list[float]
    hbm_bytes: list[float]
    pg: list[int]  # process group id per node, -1 off collectives
    remaining: list[int] = field(default_factory=list)
    left: int = 0
    queue: deque[int] = field(default_factory=deque)
    busy: bool = False
    comm: int = 0
    last: float = 0.0
    seq: dict[int, int] = field(default_factory=dict)
    use: RankUse = field(default_factory=RankUse)


@dataclass
class _Meet:
    """A collective's rendezvous: who arrived with which node."""

    op: str
    nbytes: float
    arrived: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class DagSim:
    """Run one graph per rank (``graphs[r]``, ``durations[r]`` seconds and
    ``hbm_bytes[r]`` per node) for ``steps`` steps. ``groups[g]`` are the ranks of
    process group ``g`` and ``pg[r][i]`` the group of rank r's node i (-1 elsewhere)."""

    env: simpy.Environment
    network: Network
    graphs: Sequence[RankGraph]
    durations: Sequence[list[float]]
    hbm_bytes: Sequence[list[float]]
    pg: Sequence[list[int]]
    groups: Sequence[tuple[int, ...]]
    group_names: Sequence[str]
    steps: int = 1
    record: bool = True
    progress: Progress | None = None
    serial_communicators: bool = False
    hbm: ComputeRuns | None = None
    slowdown: Mapping[int, Callable[[float, float], float]] | None = None
    rank_chip: Sequence[int] = ()
    starts: list[NDArray[np.float64]] = field(default_factory=list)
    ends: list[NDArray[np.float64]] = field(default_factory=list)
    step_ends: list[float] = field(default_factory=list)
    nodes_run: int = 0

    def __post_init__(self) -> None:
        self._ranks = [
            _Rank(g, d, h, p)
            for g, d, h, p in zip(self.graphs, self.durations, self.hbm_bytes, self.pg, strict=True)
        ]
        size = self.steps if self.record else 1
        self.starts = [np.full(size * g.size, np.nan) for g in self.graphs]
        self.ends = [np.full(size * g.size, np.nan) for g in self.graphs]
        self._succ = [(g.succ_ptr.tolist(), g.succ.tolist()) for g in self.graphs]
        self._kinds = [g.kind.tolist() for g in self.graphs]
        self._meets: dict[tuple[int, int], _Meet] = {}
        self._last: dict[int, simpy.Event] = {}
        self._mail: dict[tuple[int, int, int], deque[float]] = {}
        self._waiting: dict[tuple[int, int, int], deque[int]] = {}
        self._work: list[tuple[int, int]] = []
        self._draining = False
        self._step = 0
        self._done_ranks = 0
        self._total = sum(g.size for g in self.graphs) * self.steps

    @property
    def uses(self) -> list[RankUse]:
        return [r.use for r in self._ranks]

    @property
    def step_times_s(self) -> list[float]:
        return list(np.diff([0.0, *self.step_ends]))

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> None:
        """Run every step; a trace that cannot finish (a receive never sent, a collective
        some members never reach) is a ScenarioError naming a node that waits."""
        finished = self.env.event()
        self._finished = finished
        self._start_step()
        try:
            self.env.run(until=finished)
        except RuntimeError as exc:  # SimPy's: nothing left to run, ranks not done
            if finished.triggered or not str(exc).startswith("No scheduled events left"):
                raise
        if len(self.step_ends) != self.steps:
            raise ScenarioError("workload.chakra", MISSING, self._stuck())

    def _stuck(self) -> str:
        for r, rank in enumerate(self._ranks):
            if not rank.left:
                continue
            g = rank.graph
            base = self._index(r, 0)
            started = self.starts[r][base : base + g.size]
            ended = self.ends[r][base : base + g.size]
            waiting = np.flatnonzero(~np.isnan(started) & np.isnan(ended))
            node = int(waiting[0]) if waiting.size else int(np.flatnonzero(np.isnan(started))[0])
            return (
                f"the traces deadlock in step {self._step}: {g.label} waits at node "
                f"{g.ids[node]} ({g.names[node] or 'unnamed'}), {rank.left} of its nodes left"
            )
        return f"the traces deadlock in step {self._step}"  # pragma: no cover

    def _start_step(self) -> None:
        now = self.env.now
        for r, rank in enumerate(self._ranks):
            g = rank.graph
            rank.remaining = g.indegree.tolist()
            rank.left = g.size
            rank.last = now
            for i in np.flatnonzero(g.indegree == 0).tolist():
                self._work.append((r, i))
            if not g.size:
                self._rank_done(r)
        self._drain()

    def _drain(self) -> None:
        """Start every node on the work list whose dependencies have ended."""
        if self._draining:
            return
        self._draining = True
        work = self._work
        try:
            while work:
                r, i = work.pop()
                self._ready(r, i)
        finally:
            self._draining = False

    def _index(self, r: int, i: int) -> int:
        return (self._step * self.graphs[r].size if self.record else 0) + i

    def _ready(self, r: int, i: int) -> None:
        kind = self._kinds[r][i]
        self.starts[r][self._index(r, i)] = self.env.now
        if kind == Kind.COMPUTE:
            rank = self._ranks[r]
            rank.queue.append(i)
            if not rank.busy:
                self._next_compute(r)
        elif kind == Kind.COLLECTIVE:
            self._collective(r, i)
        elif kind == Kind.SEND:
            self._send(r, i)
        elif kind == Kind.RECV:
            self._recv(r, i)
        elif kind == Kind.MEMORY:
            self.env.timeout(self._ranks[r].durations[i]).callbacks.append(
                lambda _e: self._end(r, i)
            )
        else:
            self._end(r, i)

    def _end(self, r: int, i: int) -> None:
        """Node ``i`` of rank ``r`` has ended: start what it held back."""
        self._end_later(r, i)
        self._drain()
        if self.progress is not None and self.nodes_run % 1024 == 0:
            self.progress(min(self.nodes_run / max(self._total, 1), 1.0))

    def _rank_done(self, r: int) -> None:
        self._tick(r)
        self._done_ranks += 1
        if self._done_ranks < len(self._ranks):
            return
        self._done_ranks = 0
        self.step_ends.append(self.env.now)
        self._step += 1
        if self._step == self.steps:
            self._finished.succeed()
        else:
            self._start_step()

    # -- accounting ------------------------------------------------------------------------

    def _tick(self, r: int) -> None:
        """Charge the time since the rank's last change to what it was doing."""
        rank = self._ranks[r]
        now = self.env.now
        dt = now - rank.last
        rank.last = now
        if dt <= 0:
            return
        if rank.busy:
            rank.use.compute_s += dt
        elif rank.comm:
            rank.use.exposed_comm_s += dt
        else:
            rank.use.idle_s += dt

    def _comm(self, r: int, delta: int) -> None:
        self._tick(r)
        self._ranks[r].comm += delta

    # -- compute ---------------------------------------------------------------------------

    def _next_compute(self, r: int) -> None:
        rank = self._ranks[r]
        i = rank.queue.popleft()
        self._tick(r)
        rank.busy = True
        env = self.env
        total = rank.durations[i]
        t0 = env.now
        slow = self.slowdown.get(self.rank_chip[r]) if self.slowdown else None

        def finish(_e: Any = None) -> None:
            self._tick(r)
            took = env.now - t0
            if took > total:  # the excess counted as interference, not as compute
                rank.use.compute_s -= took - total
                rank.use.interference_s += took - total
            rank.busy = False
            self._end(r, i)
            if rank.queue and not rank.busy:
                self._next_compute(r)

        if slow is not None:
            env.timeout(slow(t0, total)).callbacks.append(finish)
            return
        hbm, nbytes = self.hbm, rank.hbm_bytes[i]
        if hbm is None or not nbytes or not total:
            env.timeout(total).callbacks.append(finish)
            return
        hbm.begin(r, nbytes, total)

        def after(_e: Any) -> None:
            assert hbm is not None
            rest = hbm.end(r)
            if rest is None:
                finish()
            else:
                rest.callbacks.append(finish)

        env.timeout(total).callbacks.append(after)

    # -- communication ---------------------------------------------------------------------

    def _collective(self, r: int, i: int) -> None:
        rank = self._ranks[r]
        g = rank.graph
        pg = rank.pg[i]
        members = self.groups[pg]
        op, nbytes = g.collective[i], float(g.nbytes[i])
        self._comm(r, +1)
        if len(members) == 1:
            self.env.timeout(0).callbacks.append(lambda _e: self._coll_end(((r, i),)))
            return
        seq = rank.seq.get(pg, 0)
        rank.seq[pg] = seq + 1
        key = (pg, seq)
        meet = self._meets.get(key)
        if meet is None:
            meet = self._meets[key] = _Meet(op, nbytes)
        elif (meet.op, meet.nbytes) != (op, nbytes):
            first_r, first_i = meet.arrived[0]
            raise ScenarioError(
                g.where(i, "comm_size" if meet.op == op else "comm_type"),
                f"{op} of {nbytes:,.0f} B",
                f"collective {seq} of group {self.group_names[pg]!r} is {meet.op} of "
                f"{meet.nbytes:,.0f} B on {self.graphs[first_r].where(first_i, 'name')[:-5]}",
            )
        meet.arrived.append((r, i))
        if len(meet.arrived) < len(members):
            return
        del self._meets[key]
        arrived = tuple(meet.arrived)
        if self.serial_communicators:
            self._in_turn(pg, op, members, nbytes, arrived)
        else:
            done = self.network.collective(op, members, nbytes)
            done.callbacks.append(lambda _e: self._coll_end(arrived))

    def _in_turn(
        self,
        pg: int,
        op: str,
        members: tuple[int, ...],
        nbytes: float,
        arrived: tuple[tuple[int, int], ...],
    ) -> None:
        """Start the collective once the one issued before it on group ``pg`` has ended."""
        end = self.env.event()
        end.callbacks.append(lambda _e: self._coll_end(arrived))
        prev = self._last.get(pg)
        self._last[pg] = end

        def start(_e: Any = None) -> None:
            done = self.network.collective(op, members, nbytes)
            done.callbacks.append(lambda _d: _succeed(end))

        if prev is None or prev.processed:
            start()
        else:
            prev.callbacks.append(start)

    def _coll_end(self, arrived: tuple[tuple[int, int], ...]) -> None:
        for r, i in arrived:
            self._comm(r, -1)
            self._end_later(r, i)
        self._drain()

    def _end_later(self, r: int, i: int) -> None:
        """Record the end of node ``i`` of rank ``r`` and put its successors whose
        dependencies have all ended on the work list (started by the next drain)."""
        rank = self._ranks[r]
        self.ends[r][self._index(r, i)] = self.env.now
        self.nodes_run += 1
        rem = rank.remaining
        ptr, succ = self._succ[r]
        for j in succ[ptr[i] : ptr[i + 1]]:
            rem[j] -= 1
            if rem[j] == 0:
                self._work.append((r, j))
        rank.left -= 1
        if rank.left == 0:
            self._rank_done(r)

    def _send(self, r: int, i: int) -> None:
        g = self.graphs[r]
        dst, tag, nbytes = int(g.peer[i]), int(g.tag[i]), float(g.nbytes[i])
        self._comm(r, +1)
        key = (r, dst, tag)

        def arrived(_e: Any) -> None:
            self._comm(r, -1)
            waiting = self._waiting.get(key)
            if waiting:
                j = waiting.popleft()
                self._comm(dst, -1)
                self._end_later(dst, j)
            else:
                self._mail.setdefault(key, deque()).append(self.env.now)
            self._end(r, i)

        if dst == r:
            self.env.timeout(0).callbacks.append(arrived)
        else:
            self.network.send(r, dst, nbytes).callbacks.append(arrived)

    def _recv(self, r: int, i: int) -> None:
        g = self.graphs[r]
        key = (int(g.peer[i]), r, int(g.tag[i]))
        mail = self._mail.get(key)
        if mail:
            mail.popleft()
            self._end(r, i)
            return
        self._comm(r, +1)
        self._waiting.setdefault(key, deque()).append(i)
