"""A serving run's requests: arrivals, dispatch to the replicas, and KV handoffs.

:class:`ServeSim` owns the SimPy environment, the replicas
(:class:`~clustersim.serve.sched.Replica`, each driven by its engine's scheduler) and
the arrival processes: a Poisson process, or a closed loop of clients that each send
their next request when the last one finished. In a disaggregated run it also moves
each prefilled request's KV to a decode replica (:class:`KvTransfer`).

:class:`Fault` events change replicas during the run (``failures.inject``, resolved by
:mod:`clustersim.serve.faults`): a replica that goes ``down`` loses its requests' KV
(:meth:`~clustersim.serve.sched.Replica.fail`); the router keeps sending it requests
until it notices, ``detect_s`` later, and then resends everything the replica held to
the replicas still up (each such request counts a retry), holding requests while none
is; ``restart_s`` after detection the replica is back, empty. A fault with a ``cost``
gives its replicas a new iteration model from then on (a lost NeuronLink lane slows
their collectives).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import simpy

from clustersim.errors import SimulationError
from clustersim.serve.sched import BLOCK_TOKENS, IterationCost, Replica, Request

__all__ = ["Fault", "KvTransfer", "ServeSim"]


class KvTransfer(Protocol):
    """Moves a request's KV cache between two replicas (disaggregated serving)."""

    def kv(self, source: int, target: int, tokens: int) -> simpy.Event: ...


@dataclass(frozen=True)
class Fault:
    """At ``at_s``, ``replicas`` go down (``down``) or take ``cost`` as their iteration
    model. ``index`` is the injection's (``failures.inject.N``)."""

    index: int
    at_s: float
    replicas: tuple[int, ...]
    down: bool = False
    detect_s: float = 0.0
    restart_s: float = 0.0
    cost: IterationCost | None = None


class ServeSim:
    """Arrivals, dispatch and the replicas of one serving run.

    ``arrival`` is ``("poisson", rate_per_s)``, ``("closed", concurrency)`` or
    ``("times", 0)`` with ``arrival_times`` (a trace's, or gamma gaps drawn before the
    run: :mod:`clustersim.serve.arrivals`); the Poisson gaps come from
    ``numpy.random.default_rng(seed)``, so a seed gives one run.
    ``prefix_hit`` is the share of each prompt found in the prefix cache: its first
    admission starts with that many of its tokens' KV in place (whole blocks, and at
    least its last token still to compute, as vLLM's automatic prefix caching does).
    ``input_tokens`` and ``output_tokens`` are every request's, or one per request.
    ``slot_tokens`` (Neuron) is the KV one batch slot reserves, whatever the request.
    ``prefill_replicas`` > 0 disaggregates: the first that many replicas only prefill
    (arrivals go to them), the rest only decode; a prefilled request's KV moves to the
    least-loaded decode replica through ``kv_transfer`` (built on the run's environment,
    so transfers share the fabric), and its first token counts when the KV has arrived.
    ``speculative`` ``(k, a)`` makes every decode step emit 1 to k + 1 tokens
    (:meth:`Replica._accepted`, from a generator seeded ``[seed, 3, replica]``); the
    ``costs`` then price a step's draft and verification
    (:class:`~clustersim.serve.speculative.SpeculativeCost`).
    ``ramp_s`` > 0 starts a closed loop's clients at times drawn uniformly from
    ``[0, ramp_s)`` (from a generator seeded ``[seed, 4]``) instead of all at once.
    """

    def __init__(
        self,
        costs: Sequence[IterationCost],
        *,
        engine: str,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        kv_blocks: int,
        requests: int,
        input_tokens: int | Sequence[int],
        output_tokens: int | Sequence[int],
        arrival: tuple[str, float],
        arrival_times: Sequence[float] | None = None,
        prefix_hit: float = 0.0,
        dispatch: str = "least_loaded",
        seed: int = 0,
        slot_tokens: int = 0,
        prefill_replicas: int = 0,
        kv_transfer: Callable[[simpy.Environment], KvTransfer] | None = None,
        speculative: tuple[int, float] | None = None,
        collapse: bool = True,
        static: bool = False,
        ramp_s: float = 0.0,
        faults: Sequence[Fault] = (),
        record: bool = False,
    ) -> None:
        self.env = simpy.Environment()
        if prefill_replicas and not 0 < prefill_replicas < len(costs):
            raise SimulationError(
                f"{prefill_replicas} prefill replicas of {len(costs)}: some must decode"
            )
        self.replicas = [
            Replica(
                self.env, i, cost, engine=engine, max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens, kv_blocks=kv_blocks,
                slot_tokens=slot_tokens,
                role=("prefill" if i < prefill_replicas else "decode") if prefill_replicas
                else "both",
                handoff=self._handoff if i < prefill_replicas else None,
                speculative=speculative, rng=np.random.default_rng([seed, 3, i]),
                collapse=collapse, static=static, record=record,
            )
            for i, cost in enumerate(costs)
        ]  # fmt: skip
        self.entry = self.replicas[:prefill_replicas] if prefill_replicas else self.replicas
        self.decoders = self.replicas[prefill_replicas:]
        self.transfer = kv_transfer(self.env) if kv_transfer is not None else None
        self.requests: list[Request] = []
        self.n = requests
        self.inputs = [input_tokens] * requests if isinstance(input_tokens, int) else input_tokens
        self.outputs = (
            [output_tokens] * requests if isinstance(output_tokens, int) else output_tokens
        )
        self.arrival = arrival
        self.arrival_times = arrival_times
        self.prefix_hit = prefix_hit
        self.dispatch = dispatch
        self.rng = np.random.default_rng(seed)
        self.ramp_s = ramp_s
        self.seed = seed
        self._next = 0
        self.faults = sorted(faults, key=lambda f: (f.at_s, f.index))
        self.fault_records: list[dict[str, Any]] = []
        self._out: set[int] = set()  # replicas the router knows are down
        self._held: deque[Request] = deque()  # requests waiting for a replica to be up

    def _new(self) -> Request:
        i = len(self.requests)
        req = Request(i, self.env.now, int(self.inputs[i]), int(self.outputs[i]))
        if self.prefix_hit > 0.0:
            hit = int(self.prefix_hit * req.input_tokens) // BLOCK_TOKENS * BLOCK_TOKENS
            req.cached_tokens = min(hit, req.input_tokens - 1)
        self.requests.append(req)
        return req

    def _send(self, req: Request) -> None:
        entry = self.entry
        if self._out:
            entry = [r for r in entry if r.index not in self._out]
            if not entry:
                self._held.append(req)
                return
        if self.dispatch == "round_robin":
            target = entry[req.id % len(entry)]
        else:
            target = min(entry, key=lambda r: r.load)
        target.submit(req)

    # -- failures

    def _inject(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        for fault in self.faults:
            if fault.at_s > env.now:
                yield env.timeout(fault.at_s - env.now)
            if not fault.down:
                for i in fault.replicas:
                    if fault.cost is not None:
                        self.replicas[i].set_cost(fault.cost)
                self.fault_records.append(
                    {"index": fault.index, "applied_s": env.now, "replicas": list(fault.replicas)}
                )
                continue
            hit = [i for i in fault.replicas if not self.replicas[i].down]
            record: dict[str, Any] = {
                "index": fault.index,
                "applied_s": env.now,
                "replicas": hit,
                "requests_in_flight": sum(
                    len(self.replicas[i].running) + len(self.replicas[i].waiting) for i in hit
                ),
            }
            self.fault_records.append(record)
            for i in hit:
                self.replicas[i].fail()
            if hit:
                env.process(self._outage(hit, fault, record))

    def _outage(
        self, hit: list[int], fault: Fault, record: dict[str, Any]
    ) -> Generator[simpy.Event, Any, None]:
        env = self.env
        yield env.timeout(fault.detect_s)
        self._out.update(hit)
        resent = [req for i in hit for req in self.replicas[i].drain()]
        record["detected_s"] = env.now
        record["requests_resent"] = len(resent)
        for req in resent:
            req.retries += 1
            self._send(req)
        yield env.timeout(fault.restart_s)
        record["back_s"] = env.now
        for i in hit:
            self.replicas[i].recover()
            self._out.discard(i)
        held, self._held = self._held, deque()
        for req in held:
            self._send(req)

    def _handoff(self, source: Replica, req: Request) -> None:
        """A prefill replica is done with ``req``: move its KV to the least-loaded decode
        replica over the fabric; its first token counts once the KV has arrived."""
        target = min(self.decoders, key=lambda r: r.load)
        target.incoming += 1
        self.env.process(self._move(source, target, req))

    def _move(
        self, source: Replica, target: Replica, req: Request
    ) -> Generator[simpy.Event, Any, None]:
        start = self.env.now
        if self.transfer is not None:
            yield self.transfer.kv(source.index, target.index, req.kv_tokens)
        req.prefill_replica = source.index
        req.kv_transfer_s = self.env.now - start
        req.first_token = self.env.now
        target.incoming -= 1
        if req.generated >= req.output_tokens:
            req.finish = self.env.now
            if req.done is not None:
                req.done.succeed()
            return
        target.submit(req)

    def _poisson(self, rate: float) -> Generator[simpy.Event, Any, None]:
        gaps = self.rng.exponential(1.0 / rate, size=self.n)
        for gap in gaps:
            yield self.env.timeout(float(gap))
            self._send(self._new())

    def _times(self, times: Sequence[float]) -> Generator[simpy.Event, Any, None]:
        for t in times:
            if t > self.env.now:
                yield self.env.timeout(t - self.env.now)
            self._send(self._new())

    def _client(self, start: float = 0.0) -> Generator[simpy.Event, Any, None]:
        if start > 0.0:
            yield self.env.timeout(start)
        while len(self.requests) < self.n:
            req = self._new()
            req.done = self.env.event()
            self._send(req)
            yield req.done

    def run(self) -> list[Request]:
        kind, value = self.arrival
        if kind == "poisson":
            self.env.process(self._poisson(value))
        elif kind == "times":
            self.env.process(self._times(self.arrival_times or ()))
        else:
            clients = min(int(value), self.n)
            starts = np.zeros(clients)
            if self.ramp_s > 0.0:
                starts = np.random.default_rng([self.seed, 4]).uniform(0.0, self.ramp_s, clients)
            for start in starts:
                self.env.process(self._client(float(start)))
        if self.faults:
            self.env.process(self._inject())
        self.env.run()
        return self.requests
