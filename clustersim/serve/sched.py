"""Each replica's scheduler: its queue, running batch and KV blocks, iteration by iteration.

(The arrivals and dispatch are :mod:`clustersim.serve.sim`'s.) Every replica is one
SimPy process that runs engine iterations back to back while it has work; an
iteration's duration comes from an :class:`IterationCost` (the chip and network model,
:class:`~clustersim.serve.iteration.IterationModel`, or a fixed time in tests). Two
schedulers, as the engines document them (both with :meth:`Request.prefix_hit`):

- ``vllm`` (vLLM V1's scheduler) and ``trtllm`` (TensorRT-LLM's in-flight
  batching): continuous batching with chunked prefill. Each iteration spends at most
  ``max_num_batched_tokens``: first on the running sequences (one token per decode,
  the next chunk of an unfinished prompt), then on admitting waiting requests, at
  most ``max_num_seqs`` running. The KV cache is paged in blocks of
  ``BLOCK_TOKENS``; a request is admitted only while its chunk's blocks are free,
  and when a running sequence needs a block that is not free the most recently
  admitted sequence is preempted: its blocks are freed and it goes back to the
  front of the queue, to recompute its prompt and the tokens it had generated.
  ``trtllm`` differs in two rules, TensorRT-LLM's defaults: chunked context is off
  (``enable_chunked_prefill``, LLM API), so a waiting prompt joins an iteration only
  whole, within ``max_num_batched_tokens`` (its ``max_num_tokens``; a prompt longer
  than the whole budget is still split when it runs alone); and the capacity
  scheduler's ``GUARANTEED_NO_EVICT`` policy admits a request only when the KV of its
  prompt and all its output tokens can be reserved, so it is never preempted.
- ``neuron`` (vllm-neuron and NxD Inference): prefill and decode never share an
  iteration. A waiting request, when a batch slot is free, is prefilled alone in
  segments of ``max_num_batched_tokens`` while every decode stalls; a decode
  iteration computes the compiled batch of ``max_num_seqs`` rows however many
  slots are live, each attending over the compiled KV bucket of the longest live
  sequence, and a prompt segment computes its padded bucket (:func:`bucket`).
  The KV cache is reserved per slot at compile time, so there is no preemption.

``static`` batching (any engine) forms a batch of waiting requests, prefills it
together and decodes it until all are done. Decode iterations where nothing can
change run as one timeout (:meth:`Replica._run_length`).

A replica can fail (:meth:`Replica.fail`): the iteration in progress is abandoned,
every request it held loses its KV and waits, to be prefilled again (its prompt and
the tokens it had generated, as after a preemption) wherever the router sends it
next; the replica runs nothing until :meth:`Replica.recover`. With ``record``, each
iteration (or run of decode iterations in one timeout) is logged in ``log`` for the
trace and the report (:data:`LOG_FIELDS`).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np
import simpy

from clustersim.errors import SimulationError
from clustersim.serve.requests import (
    BLOCK_TOKENS,
    LOG_FIELDS,
    MIN_BUCKET,
    IterationCost,
    Request,
    bucket,
)

__all__ = [
    "BLOCK_TOKENS",
    "LOG_FIELDS",
    "MIN_BUCKET",
    "IterationCost",
    "Replica",
    "Request",
    "bucket",
]


class Replica:
    """One replica's queue, running batch and KV blocks, driven by its scheduler."""

    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        cost: IterationCost,
        *,
        engine: str,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        kv_blocks: int,
        slot_tokens: int = 0,
        role: str = "both",
        handoff: Callable[[Replica, Request], None] | None = None,
        speculative: tuple[int, float] | None = None,
        rng: np.random.Generator | None = None,
        collapse: bool = True,
        static: bool = False,
        record: bool = False,
    ) -> None:
        self.env = env
        self.static = static
        """Static batching: a batch of up to ``max_num_seqs`` waiting requests is
        prefilled together and decoded until every one of them is done; only then is the
        next batch formed (Transformers-NeuronX with continuous batching off, as the
        Neuron SDK's latency and throughput tables run)."""
        self.slot_tokens = slot_tokens
        self.role = role
        """``both``, or in a disaggregated run ``prefill`` (a request leaves once its prompt
        is prefilled, through ``handoff``) or ``decode`` (requests arrive with their KV)."""
        self.handoff = handoff
        self.speculative = speculative
        """``(k, a)``: each decode step proposes k draft tokens, each accepted with
        probability a; a step emits the accepted prefix plus the target's own token."""
        self.decode_tokens = 1 + (speculative[0] if speculative else 0)
        self.rng = rng if rng is not None else np.random.default_rng(index)
        self.decode_steps = 0
        self.decode_emitted = 0
        self.collapse = collapse
        """Run decode iterations where nothing can change as one timeout (the same
        result, far fewer events: :meth:`_run_length`)."""
        self.index = index
        self.cost = cost
        self.neuron = engine == "neuron"
        self.chunked = engine != "trtllm"
        self.max_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.kv_blocks = kv_blocks
        self.used_blocks = 0
        self.peak_blocks = 0
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0
        self.iterations = 0
        self.busy_s = 0.0
        self._wake: simpy.Event | None = None
        self.incoming = 0
        """Requests whose KV is on its way here (disaggregated decode replicas)."""
        self.log: list[tuple[float, float, int, int, int, int, int]] | None = [] if record else None
        self.down = False
        """Failed and not yet restarted (:meth:`fail`, :meth:`recover`)."""
        self.kv_tokens_lost = 0
        self._up: simpy.Event | None = None
        self._inflight: tuple[float, Sequence[float], Sequence[Request]] | None = None
        """The iteration or decode run in progress: its start, the ends of its steps
        (from the start), and the decodes of a run (what a failure must account for)."""
        self.process = env.process(self._loop())

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.running) + self.incoming

    def submit(self, req: Request) -> None:
        req.replica = self.index
        self.waiting.append(req)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _loop(self) -> Generator[simpy.Event, Any, None]:
        while True:
            try:
                yield from self._serve()
            except simpy.Interrupt:  # failed (:meth:`fail`): wait for the restart
                self._wake = None
                self._up = self.env.event()
                yield self._up
                self._up = None

    def _serve(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        while True:
            if not self.waiting and not self.running:
                self._wake = env.event()
                yield self._wake
                self._wake = None
            if self.static:
                chunks, decodes = self._plan_static()
            elif self.neuron:
                chunks, decodes = self._plan_neuron()
            else:
                chunks, decodes = self._plan_vllm()
            if not chunks and not decodes:
                if self.running or not self.waiting:
                    continue  # preempted every sequence: admit again at once
                raise SimulationError(f"replica {self.index}: a request cannot fit its KV cache")
            steps = self._run_length(chunks, decodes)
            if steps > 1:
                yield from self._decode_run(decodes, steps)
                continue
            if self.neuron:  # compiled buckets: the program computes the padded shapes
                work = [(bucket(c, self.budget), r.kv_tokens) for r, c in chunks]
                padded: int | None = None
                context = 0
                if decodes:
                    longest = max(r.kv_tokens for r in decodes) + 1
                    context = self.max_seqs * bucket(longest, self.slot_tokens or longest)
                    padded = self.max_seqs
            else:
                work = [(c, r.kv_tokens) for r, c in chunks]
                context, padded = sum(r.kv_tokens for r in decodes), None
            t = self.cost.iteration_s(work, len(decodes), context, padded_decodes=padded)
            self._inflight = (env.now, (t,), ())
            if self.log is not None:  # logged at its start: a failure may cut it short
                prompt = sum(c for _, c in chunks)
                self.log.append(
                    (env.now, t, prompt, len(chunks) + len(decodes), 1, self.used_blocks, 0)
                )
            yield env.timeout(t)
            self._inflight = None
            self.iterations += 1
            self.busy_s += t
            self._complete(chunks, decodes)

    # -- failures

    def fail(self) -> None:
        """The replica fails now: the iteration in progress is lost (the decode
        iterations of a run that completed before now count), and every request it
        holds loses its KV and waits in ``waiting`` (for the router to take,
        :meth:`drain`), to prefill its prompt and generated tokens again elsewhere."""
        if self.down:
            return
        self.down = True
        now = self.env.now
        if self._inflight is not None:
            start, ends, decodes = self._inflight
            done = bisect.bisect_left(ends, now - start) if len(ends) > 1 else 0
            for req in decodes:  # decode steps of a run that finished before the failure
                req.generated += done
                req.kv_tokens += done
            self.iterations += done
            self.decode_steps += done * len(decodes)
            self.decode_emitted += done * len(decodes)
            self.busy_s += now - start
            if self.log is not None:
                _, _, prompt, seqs, _, blocks, _ = self.log[-1]
                self.log[-1] = (start, now - start, prompt, seqs, done, blocks, 1)
            self._inflight = None
        held = [*self.running, *self.waiting]
        for req in held:
            self.kv_tokens_lost += req.kv_tokens
            req.blocks = 0
            req.kv_tokens = 0
            req.prompt_target = req.input_tokens + req.generated
        self.running.clear()
        self.waiting = deque(held)
        self.used_blocks = 0
        self._wake = None
        self.process.interrupt("failed")

    def set_cost(self, cost: IterationCost) -> None:
        """Iterations from now on take ``cost``'s times; a run of decode iterations in
        one timeout ends after the iteration in progress, as an arrival ends it."""
        self.cost = cost
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def drain(self) -> list[Request]:
        """The requests waiting here, taken away (the router resends a failed replica's)."""
        held = list(self.waiting)
        self.waiting.clear()
        return held

    def recover(self) -> None:
        """The replica is back, empty, and runs what it is sent."""
        self.down = False
        if self._up is not None and not self._up.triggered:
            self._up.succeed()

    # -- runs of decode iterations where nothing can change, in one timeout

    def _run_length(self, chunks: list[tuple[Request, int]], decodes: list[Request]) -> int:
        """How many decode iterations can run as one timeout: with no prompt to prefill,
        no request waiting and every running sequence decoding, the batch stays as it
        is until its first sequence finishes (an arrival interrupts the run). vLLM's
        rules also need the KV blocks of the whole run free; speculative steps, whose
        lengths are drawn, run one by one."""
        if not self.collapse or chunks or self.speculative is not None:
            return 1
        if self.waiting and not self.static:
            return 1
        if len(decodes) != len(self.running):
            return 1
        steps = min(r.output_tokens - r.generated for r in decodes)
        if steps < 2:
            return 1
        if not self.neuron:  # this step's blocks are held: hold the rest of the run's
            need = sum(self._blocks_for(r, steps) for r in decodes)
            if self.used_blocks + need > self.kv_blocks:
                return 1
            for r in decodes:
                self._grow(r, steps)
        return steps

    def _decode_run(self, decodes: list[Request], steps: int) -> Generator[simpy.Event, Any, None]:
        """Up to ``steps`` decode iterations as one timeout. An arrival (a ``submit``)
        ends the run after the iteration in progress, as it would join the next one."""
        env, n = self.env, len(decodes)
        kv = [r.kv_tokens for r in decodes]
        ends: list[float] = []
        total = 0.0
        for j in range(steps):
            if self.neuron:
                longest = max(kv) + 1 + j
                context = self.max_seqs * bucket(longest, self.slot_tokens or longest)
                total += self.cost.iteration_s((), n, context, padded_decodes=self.max_seqs)
            else:
                total += self.cost.iteration_s((), n, sum(kv) + j * n)
            ends.append(total)
        start = env.now
        self._inflight = (start, ends, decodes)
        if self.log is not None:
            self.log.append((start, total, 0, n, steps, self.used_blocks, 0))
        self._wake = env.event()
        run = env.timeout(total)
        yield run | self._wake
        self._wake = None
        done = steps
        if not run.processed and env.now < start + total:
            done = min(bisect.bisect_right(ends, env.now - start) + 1, steps)
            if self.log is not None and done < steps:
                self.log[-1] = (start, ends[done - 1], 0, n, done, self.log[-1][5], 0)
            yield env.timeout(start + ends[done - 1] - env.now)
        self._inflight = None
        self.iterations += done
        self.busy_s += ends[done - 1]
        self.decode_steps += done * n
        self.decode_emitted += done * n
        now = env.now
        for req in decodes:
            req.kv_tokens += done
            req.generated += done
            if req.generated >= req.output_tokens:
                req.finish = now
                self._release(req)
                if req.done is not None:
                    req.done.succeed()

    # -- vLLM: continuous batching, chunked prefill, paged KV, preemption by recompute

    def _blocks_for(self, req: Request, tokens: int) -> int:
        """Blocks ``req`` still needs for ``tokens`` more tokens (none where it holds
        them already: a reservation, or a decode run's)."""
        return max(math.ceil((req.kv_tokens + tokens) / BLOCK_TOKENS) - req.blocks, 0)

    def _grow(self, req: Request, tokens: int) -> bool:
        need = self._blocks_for(req, tokens)
        if self.used_blocks + need > self.kv_blocks:
            return False
        req.blocks += need
        self.used_blocks += need
        self.peak_blocks = max(self.peak_blocks, self.used_blocks)
        return True

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.used_blocks -= req.blocks
        req.blocks = 0
        req.kv_tokens = 0
        req.prompt_target = req.input_tokens + req.generated
        req.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(req)

    def _plan_vllm(self) -> tuple[list[tuple[Request, int]], list[Request]]:
        budget = self.budget
        chunks: list[tuple[Request, int]] = []
        decodes: list[Request] = []
        preempted = False
        for req in list(self.running):
            if req not in self.running or budget == 0:
                continue
            left = req.prompt_target - req.kv_tokens
            if left <= 0 and budget < self.decode_tokens:
                continue
            tokens = min(left, budget) if left > 0 else self.decode_tokens
            while not self._grow(req, tokens):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            if req not in self.running:
                continue
            budget -= tokens
            if left > 0:
                chunks.append((req, tokens))
            else:
                decodes.append(req)
        while not preempted and self.waiting and budget > 0 and len(self.running) < self.max_seqs:
            req = self.waiting[0]
            left = req.prompt_target - req.kv_tokens
            if left == 0:  # its KV came from a prefill replica: it decodes at once
                if budget < self.decode_tokens or not self._grow(req, self.decode_tokens):
                    break
                self.waiting.popleft()
                self.running.append(req)
                decodes.append(req)
                budget -= self.decode_tokens
                continue
            left -= (hit := req.prefix_hit())
            if not self.chunked and left > budget and (chunks or decodes):
                break  # TensorRT-LLM schedules a context whole, in one iteration
            tokens = min(left, budget)
            # TensorRT-LLM's GUARANTEED_NO_EVICT: the whole request's KV (prompt and every
            # output token) is reserved at admission, so nothing is ever preempted
            reserve = req.prompt_target + req.output_tokens - req.generated - req.kv_tokens
            if not self._grow(req, hit + tokens if self.chunked else max(reserve, hit + tokens)):
                break
            req.kv_tokens += hit
            self.waiting.popleft()
            if math.isnan(req.scheduled):
                req.scheduled = self.env.now
            self.running.append(req)
            chunks.append((req, tokens))
            budget -= tokens
        return chunks, decodes

    # -- Neuron: prefill alone (decodes stall), fixed decode batch, static KV

    def _plan_static(self) -> tuple[list[tuple[Request, int]], list[Request]]:
        if not self.running:
            while self.waiting and len(self.running) < self.max_seqs:
                req = self.waiting.popleft()
                if math.isnan(req.scheduled):
                    req.scheduled = self.env.now
                slot = self.slot_tokens or req.input_tokens + req.output_tokens
                req.kv_tokens += req.prefix_hit()  # its slot's blocks are the same
                self._grow(req, max(slot - req.kv_tokens, 0))
                self.running.append(req)
        chunks = [
            (r, min(r.prompt_target - r.kv_tokens, self.budget))
            for r in self.running
            if r.prompt_target > r.kv_tokens
        ]
        return (chunks, []) if chunks else ([], list(self.running))

    def _plan_neuron(self) -> tuple[list[tuple[Request, int]], list[Request]]:
        for req in self.running:  # a prompt still being prefilled in segments
            left = req.prompt_target - req.kv_tokens
            if left > 0:
                return [(req, min(left, self.budget))], []
        while self.waiting and len(self.running) < self.max_seqs:
            req = self.waiting.popleft()
            if math.isnan(req.scheduled):
                req.scheduled = self.env.now
            # the slot's static KV, compiled for the longest request
            slot = self.slot_tokens or req.input_tokens + req.output_tokens
            req.kv_tokens += req.prefix_hit()  # its slot's blocks are the same
            self._grow(req, max(slot - req.kv_tokens, 0))
            self.running.append(req)
            if req.prompt_target > req.kv_tokens:
                return [(req, min(req.prompt_target - req.kv_tokens, self.budget))], []
            # its KV came from a prefill replica: the slot joins the decode batch
        return [], list(self.running)

    def _complete(self, chunks: list[tuple[Request, int]], decodes: list[Request]) -> None:
        now = self.env.now
        emitted: list[tuple[Request, int]] = []
        for req, tokens in chunks:
            req.kv_tokens += tokens
            if req.kv_tokens == req.prompt_target:
                emitted.append((req, 1))
        for req in decodes:
            n = 1 if self.speculative is None else self._accepted()
            n = min(n, req.output_tokens - req.generated)
            self.decode_steps += 1
            self.decode_emitted += n
            req.kv_tokens += n
            emitted.append((req, n))
        for req, n in emitted:
            if req.generated == 0:
                if self.handoff is not None and req.output_tokens > 1:
                    # disaggregated: the first token leaves with the KV, which the
                    # decode replica must receive before the token counts as sent
                    req.generated = 1
                    self._release(req)
                    self.handoff(self, req)
                    continue
                req.first_token = now
            req.generated += n
            if req.generated >= req.output_tokens:
                req.finish = now
                self._release(req)
                if req.done is not None:
                    req.done.succeed()

    def _accepted(self) -> int:
        """Tokens one speculative step emits: the draft's accepted prefix (each of its k
        tokens accepted with probability a, until the first rejection) plus one."""
        assert self.speculative is not None
        k, a = self.speculative
        n = 0
        while n < k and self.rng.random() < a:
            n += 1
        return n + 1

    def _release(self, req: Request) -> None:
        self.running.remove(req)
        self.used_blocks -= req.blocks
        req.blocks = 0
