"""The long-horizon model: one training job over days to months, as SimPy processes.

A :class:`JobModel` holds plain numbers: the failure classes of the cluster, the
healthy (and degraded) step time the step simulation measured, checkpointing,
detection, restart, spares and the recovery policy. :func:`simulate_job` runs
one replication for one seed and returns an :class:`Outcome`.

Processes, and why there are few events:

- **failures**: one process walks the failure times of every class (drawn up
  front by ``processes.sample_failures``), one timeout per failure;
- **job**: one process in states ``train``, ``checkpoint`` (a synchronous write,
  or an asynchronous snapshot and the wait for the previous write), ``reroute``
  and ``down`` (detection, waiting for nodes, restart). Training between two
  checkpoints is one timeout: progress is arithmetic (tokens = time x rate), never
  one event per step;
- **repairs**: a failed node returns to the spare pool, and a cut link to
  service, after the class's repair time.

A failure, a repair or a returning node changes the job's state and interrupts
its timeout, and the job plans its next transition again.

Recovery policies (as on the EKS UltraServer operator):

- ``restart_all``: detect, replace every failed node (a hot spare at once, else
  a new node after ``replace_time`` or a repaired one if sooner), restart the
  whole job, read the last checkpoint back, and redo the work since it;
- ``migrate_affected``: the same, but a node failure only moves the affected
  node's ranks to a spare (``migrate_time`` instead of ``restart_time``); the
  job still rolls back to its last checkpoint, and software faults still restart
  everything;
- ``continue_degraded``: a cut link is routed around after the detection time
  and the job goes on at the degraded step time until the link is repaired, with
  no rollback; node and software faults restart as ``restart_all``.

Under the first two policies a cut link takes its node out of the job (cordoned
until repaired, replaced by a spare) like a node failure, so the restarted job
runs healthy; under ``continue_degraded`` the job keeps the node and pays the
degraded step time instead.

Failures strike at any time, also while checkpointing and recovering (a failure
during a recovery starts it again), as in Daly's model: with exponential
failures the means converge to ``analytic.expected_ettr``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import simpy

from clustersim.failures.processes import FailureClass, sample_failures

__all__ = ["EVENT_COLUMNS", "JobModel", "Outcome", "simulate_job"]

Recovery = Literal["restart_all", "migrate_affected", "continue_degraded"]
TIME_PARTS = ("training", "checkpoint", "reroute", "detection", "waiting_for_nodes", "restart")
"""Where wall time goes; ``training`` includes the work later rolled back."""
EVENT_COLUMNS = (
    "time_s",
    "class",
    "cause",
    "effect",
    "action",
    "state",
    "lost_tokens",
    "downtime_s",
)
"""One row per failure: what it hit, what the job did, the work it lost and the
downtime until the job trained again (or until the next failure, if sooner)."""


@dataclass(frozen=True)
class JobModel:
    """The job and its environment, in SI units."""

    classes: tuple[FailureClass, ...]
    step_time_s: float
    tokens_per_step: float
    interval_s: float
    """Training time between checkpoints, at the healthy step time."""
    write_s: float
    read_s: float
    mode: Literal["sync", "async"] = "sync"
    snapshot_s: float = 0.0
    detection_s: float = 0.0
    restart_s: float = 0.0
    migrate_s: float = 0.0
    replace_s: float = 0.0
    spares: int = 0
    recovery: Recovery = "restart_all"
    degraded_step_time_s: float | None = None
    horizon_s: float | None = None
    target_tokens: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_time_s

    @property
    def limit_s(self) -> float:
        """Simulated wall time: the horizon, or time enough for the target at 5% ETTR."""
        if self.horizon_s is not None:
            return self.horizon_s
        assert self.target_tokens is not None  # checked where the model is built
        return 20.0 * self.target_tokens / self.tokens_per_s


@dataclass
class Outcome:
    """One replication."""

    seed: int
    wall_s: float
    useful_tokens: float
    lost_tokens: float
    time_s: dict[str, float]
    degraded_s: float
    time_to_target_s: float | None
    events: list[tuple[Any, ...]] = field(default_factory=list)

    @property
    def goodput(self) -> float:
        done = self.useful_tokens + self.lost_tokens
        return self.useful_tokens / done if done > 0 else 1.0

    def ettr(self, tokens_per_s: float) -> float:
        """Useful work, as healthy training time, over wall time."""
        return self.useful_tokens / tokens_per_s / self.wall_s if self.wall_s > 0 else 0.0


class _Job:
    """The job's state machine; see the module docstring."""

    def __init__(self, env: simpy.Environment, m: JobModel) -> None:
        self.env, self.m = env, m
        self.rate = m.tokens_per_s
        self.rate_degraded = (
            m.tokens_per_step / m.degraded_step_time_s
            if m.degraded_step_time_s is not None
            else self.rate
        )
        self.interval_tokens = m.interval_s * self.rate
        self.state, self.phase_end = "train", 0.0
        self.pos = self.durable = 0.0
        self.next_ckpt = self.interval_tokens
        self.ckpt_pos = 0.0
        self.pending: tuple[float, float] | None = None  # async: (position, durable at)
        self.lost = 0.0
        self.time = dict.fromkeys(TIME_PARTS, 0.0)
        self.degraded_s = 0.0
        self.links_down = 0
        self.nodes_needed = 0
        self.full_restart = False
        self.spares_free = m.spares
        self.mark = 0.0
        self.events: list[list[Any]] = []
        self.open_event: int | None = None
        self.done_at: float | None = None
        self.poked = False
        self.proc = env.process(self._run())

    # -- bookkeeping -----------------------------------------------------------------

    def _degraded(self) -> bool:
        return self.links_down > 0 and self.m.recovery == "continue_degraded"

    def _account(self) -> None:
        now = self.env.now
        dt = now - self.mark
        self.mark = now
        if dt <= 0:
            return
        s = self.state
        if s == "train":
            degraded = self._degraded()
            self.pos += dt * (self.rate_degraded if degraded else self.rate)
            self.time["training"] += dt
            if degraded:
                self.degraded_s += dt
        elif s in ("checkpoint", "snapshot", "wait_write"):
            self.time["checkpoint"] += dt
        elif s == "reroute":
            self.time["reroute"] += dt
        elif s == "detect":
            self.time["detection"] += dt
        elif s == "acquire":
            self.time["waiting_for_nodes"] += dt
        else:
            self.time["restart"] += dt

    def _close_event(self) -> None:
        if self.open_event is not None:
            row = self.events[self.open_event]
            row[7] = self.env.now - row[0]
            self.open_event = None

    def _poke(self) -> None:
        if not self.poked and self.done_at is None:
            self.poked = True
            self.proc.interrupt()

    def _durable_now(self) -> float:
        if self.pending is not None and self.pending[1] <= self.env.now:
            self.durable = self.pending[0]
            self.pending = None
        return self.durable

    # -- the job process ---------------------------------------------------------------

    def _plan(self) -> float:
        if self.state == "train":
            goal = self.next_ckpt
            if self.m.target_tokens is not None:
                goal = min(goal, self.m.target_tokens)
            rate = self.rate_degraded if self._degraded() else self.rate
            return self.env.now + max(goal - self.pos, 0.0) / rate
        return self.phase_end

    def _run(self) -> Any:
        while self.done_at is None:
            end = self._plan()
            try:
                yield self.env.timeout(max(end - self.env.now, 0.0))
            except simpy.Interrupt:
                self.poked = False
                continue
            self._account()
            self._advance()

    def _enter(self, state: str, duration: float) -> None:
        self.state, self.phase_end = state, self.env.now + duration

    def _advance(self) -> None:
        """The current state has run its course."""
        m, s = self.m, self.state
        if s == "train":
            target = m.target_tokens
            if target is not None and self.pos >= target * (1 - 1e-12):
                self.done_at = self.env.now
            elif m.mode == "sync":
                self.ckpt_pos = self.pos
                self._enter("checkpoint", m.write_s)
            elif self.pending is not None and self.pending[1] > self.env.now:
                self._enter("wait_write", self.pending[1] - self.env.now)
            else:
                self._enter("snapshot", m.snapshot_s)
        elif s == "checkpoint":
            self.durable = self.ckpt_pos
            self.next_ckpt = self.durable + self.interval_tokens
            self.state = "train"
        elif s == "wait_write":
            self._durable_now()
            self._enter("snapshot", m.snapshot_s)
        elif s == "snapshot":
            self._durable_now()
            self.pending = (self.pos, self.env.now + m.write_s)
            self.next_ckpt = self.pos + self.interval_tokens
            self.state = "train"
        elif s == "reroute":
            self._close_event()
            self.state = "train"
        elif s == "detect":
            self._acquire()
        elif s == "acquire":  # new nodes arrived, all those still needed at once
            self.nodes_needed = 0
            self._restart()
        else:  # restart done
            self._close_event()
            self.full_restart = False
            self.next_ckpt = self.pos + self.interval_tokens
            self.state = "train"

    def _acquire(self) -> None:
        take = min(self.spares_free, self.nodes_needed)
        self.spares_free -= take
        self.nodes_needed -= take
        if self.nodes_needed:
            self._enter("acquire", self.m.replace_s)
        else:
            self._restart()

    def _restart(self) -> None:
        m = self.m
        base = m.migrate_s if not self.full_restart else m.restart_s
        self._enter("restart", base + m.read_s)

    # -- external events ---------------------------------------------------------------

    def on_failure(self, cls: FailureClass) -> None:
        self._account()
        now, state = self.env.now, self.state
        degrade = (
            cls.effect == "link"
            and self.m.recovery == "continue_degraded"
            and self.m.degraded_step_time_s is not None
        )
        row: list[Any] = [now, cls.name, cls.cause, cls.effect, "", state, 0.0, 0.0]
        self.events.append(row)
        if degrade:
            self.links_down += 1
            self.env.process(self._repair_link(cls.repair_s))
            row[4] = "degrade"
            if state == "train":
                self._close_event()
                self.open_event = len(self.events) - 1
                self._enter("reroute", self.m.detection_s)
                self._poke()
            return  # elsewhere the job goes on; it trains degraded once it trains again
        # A cut link the job does not run degraded over takes its node out of the job
        # (cordoned until the link is repaired), as a node failure does.
        if cls.effect in ("node", "link"):
            self.nodes_needed += 1
            self.env.process(self._repair_node(cls.repair_s))
        migratable = cls.effect != "job" and self.m.recovery == "migrate_affected"
        row[4] = "migrate" if migratable else "restart"
        down = state in ("detect", "acquire", "restart")
        if not down:
            self.full_restart = not migratable
            durable = self._durable_now()
            self.pending = None
            row[6] = self.pos - durable
            self.lost += self.pos - durable
            self.pos = durable
        else:
            self.full_restart = self.full_restart or not migratable
        self._close_event()
        self.open_event = len(self.events) - 1
        self._enter("detect", self.m.detection_s)
        self._poke()

    def _repair_link(self, repair_s: float) -> Any:
        yield self.env.timeout(repair_s)
        self._account()
        self.links_down -= 1
        if self.state == "train" and self.links_down == 0:
            self._poke()  # back to the healthy rate: plan again

    def _repair_node(self, repair_s: float) -> Any:
        yield self.env.timeout(repair_s)
        self._account()
        if self.state == "acquire" and self.nodes_needed:
            self.nodes_needed -= 1  # the repaired node goes straight back into the job
            if not self.nodes_needed:
                self._restart()
                self._poke()
        elif self.spares_free < self.m.spares:
            self.spares_free += 1


def _failure_times(
    m: JobModel, horizon_s: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    times = [sample_failures(c, horizon_s, rng) for c in m.classes]
    which = [np.full(t.size, i, dtype=np.int64) for i, t in enumerate(times)]
    all_t = np.concatenate(times) if times else np.empty(0)
    all_c = np.concatenate(which) if which else np.empty(0, dtype=np.int64)
    order = np.argsort(all_t, kind="stable")
    return all_t[order], all_c[order]


def simulate_job(m: JobModel, seed: int, base_seed: int = 0) -> Outcome:
    """One replication; every random number comes from ``(base_seed, seed)``."""
    rng = np.random.default_rng(np.random.SeedSequence([base_seed, seed]))
    limit = m.limit_s
    times, which = _failure_times(m, limit, rng)
    env = simpy.Environment()
    job = _Job(env, m)

    def failures() -> Any:
        for t, c in zip(times.tolist(), which.tolist(), strict=True):
            yield env.timeout(t - env.now)
            if job.done_at is not None:
                return
            job.on_failure(m.classes[c])

    env.process(failures())
    env.run(until=env.any_of([job.proc, env.timeout(limit)]))
    job._account()
    job._close_event()
    return Outcome(
        seed=seed,
        wall_s=env.now,
        useful_tokens=job.pos,
        lost_tokens=job.lost,
        time_s=job.time,
        degraded_s=job.degraded_s,
        time_to_target_s=job.done_at,
        events=[tuple(r) for r in job.events],
    )
