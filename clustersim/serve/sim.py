"""A serving run's requests: arrivals, dispatch to the replicas, and KV handoffs.

:class:`ServeSim` owns the SimPy environment, the replicas
(:class:`~clustersim.serve.sched.Replica`, each driven by its engine's scheduler) and
the arrival processes: a Poisson process, or a closed loop of clients that each send
their next request when the last one finished. In a disaggregated run it also moves
each prefilled request's KV to a decode replica (:class:`KvTransfer`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any, Protocol

import numpy as np
import simpy

from clustersim.errors import SimulationError
from clustersim.serve.sched import IterationCost, Replica, Request

__all__ = ["KvTransfer", "ServeSim"]


class KvTransfer(Protocol):
    """Moves a request's KV cache between two replicas (disaggregated serving)."""

    def kv(self, source: int, target: int, tokens: int) -> simpy.Event: ...


class ServeSim:
    """Arrivals, dispatch and the replicas of one serving run.

    ``arrival`` is ``("poisson", rate_per_s)`` or ``("closed", concurrency)``; the
    Poisson gaps come from ``numpy.random.default_rng(seed)``, so a seed gives one run.
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
        dispatch: str = "least_loaded",
        seed: int = 0,
        slot_tokens: int = 0,
        prefill_replicas: int = 0,
        kv_transfer: Callable[[simpy.Environment], KvTransfer] | None = None,
        speculative: tuple[int, float] | None = None,
        collapse: bool = True,
        static: bool = False,
        ramp_s: float = 0.0,
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
                collapse=collapse, static=static,
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
        self.dispatch = dispatch
        self.rng = np.random.default_rng(seed)
        self.ramp_s = ramp_s
        self.seed = seed
        self._next = 0

    def _new(self) -> Request:
        i = len(self.requests)
        req = Request(i, self.env.now, int(self.inputs[i]), int(self.outputs[i]))
        self.requests.append(req)
        return req

    def _send(self, req: Request) -> None:
        if self.dispatch == "round_robin":
            target = self.entry[req.id % len(self.entry)]
        else:
            target = min(self.entry, key=lambda r: r.load)
        target.submit(req)

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
        else:
            clients = min(int(value), self.n)
            starts = np.zeros(clients)
            if self.ramp_s > 0.0:
                starts = np.random.default_rng([self.seed, 4]).uniform(0.0, self.ramp_s, clients)
            for start in starts:
                self.env.process(self._client(float(start)))
        self.env.run()
        return self.requests
